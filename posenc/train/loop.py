"""train(cfg, run_dir) -> summary: the whole training run as a plain function.

AdamW (decoupled weight decay on matrices only), linear warmup then cosine decay, gradient
clipping, gradient accumulation, periodic evaluation on fixed validation windows, a
checkpoint at ``checkpoints/last.pt``, metrics to metrics.jsonl and W&B.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from posenc.train import distributed
from posenc.eval import extrapolation
from posenc.train.checkpoint import GracefulStop, Resumed, TrainingDiverged, check_finite, resume_training, save_checkpoint
from posenc.metrics import convergence_metrics, elapsed_before
from posenc.data.batches import RandomWindows
from posenc.build import build_data, build_model, check_encodable, encoding_summary, seed_everything
from posenc.eval.loss import evaluate_loss, loss_metrics
from posenc.hardware import (autocast_context, enable_fast_matmul, peak_flops, resolve_device, resolve_precision,
                             to_device, use_compile)
from posenc.nn.model import GPT
from posenc.train.progress import TrainProgress
from posenc.rundir import METRICS_FILE, read_jsonl, wandb_group
from posenc.tracking import Tracker
from posenc.config import validate as validate_config

log = logging.getLogger("posenc")


def lr_lambda(warmup_steps: int, max_steps: int, min_lr_ratio: float):
    """Multiplier of trainer.lr at a step: linear warmup, then cosine decay to min_lr_ratio."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def configure_optimizer(model: GPT, tcfg: DictConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, LayerNorms, bias tables)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), fused=device.type == "cuda")


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train one model as cfg says, writing everything into run_dir; return the summary."""
    validate_config(cfg)
    check_encodable(cfg)
    started = time.time()
    device = distributed.local_device(resolve_device(cfg.device))
    precision = resolve_precision(cfg.trainer.precision, device)
    autocast = autocast_context(precision, device)
    enable_fast_matmul(device)
    seed_everything(cfg.seed)
    t = cfg.trainer

    data = build_data(cfg)
    model = build_model(cfg, data.vocab_size)
    model.to(device)
    n_params = model.num_params()
    flops_per_token = model.flops_per_token(t.seq_len)
    peak = peak_flops(device, cfg.trainer.get("peak_flops"))
    log.info("model: %s params, encoding %s, device %s, precision %s", f"{n_params:,}", model.encoding.extra_repr(), device, precision)

    batches = RandomWindows(data.train, t.seq_len, t.batch_size, seed=cfg.seed,
                            rank=distributed.rank(), world_size=distributed.world_size())
    optimizer = configure_optimizer(model, t, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.warmup_steps, t.max_steps, t.min_lr_ratio))
    step_model = distributed.wrap(model, device)
    step_model = torch.compile(step_model) if use_compile(t.compile, device) else step_model
    tokens_per_step = t.batch_size * t.seq_len * t.grad_accum * distributed.world_size()
    resumed = resume_training(run_dir, cfg, model, optimizer, scheduler, batches) if t.get("resume") else Resumed()
    bytes_per_token = data.bytes_per_token("validation")

    tracker = Tracker(run_dir, enabled=distributed.is_main())  # rank 0 alone writes the run's files
    logger_cfg = cfg.logger
    exit_code = 1
    try:
        if logger_cfg.name == "wandb":
            tracker.start_wandb(
                config=OmegaConf.to_container(cfg, resolve=True),  # W&B shows nested keys flat: encoding.base
                project=logger_cfg.project, mode=logger_cfg.mode, group=wandb_group(logger_cfg.group),
                job_type=logger_cfg.job_type, tags=[model.encoding.name, *list(logger_cfg.tags or [])],
                name=run_dir.name, entity=logger_cfg.entity, run_id=resumed.wandb_id,
            )

        def evaluate() -> dict[str, float]:
            loss = evaluate_loss(model, data.validation, t.seq_len, t.eval_batches * t.batch_size,
                                 t.batch_size, device, autocast)
            return loss_metrics(loss, bytes_per_token)

        step, tokens = resumed.step, resumed.tokens
        val: dict[str, float] = resumed.val
        window_start, window_tokens = time.time(), 0
        # elapsed_s in every row: seconds of training (a resumed run continues its clock), for convergence
        loop_start = window_start - (elapsed_before(read_jsonl(run_dir / METRICS_FILE), step)
                                     if step and tracker.enabled else 0.0)
        with TrainProgress(t.max_steps) as progress, GracefulStop() as stop:
            while step < t.max_steps:
                loss_sum = torch.zeros((), device=device)
                for _ in range(t.grad_accum):
                    x, y = to_device(batches.next(), device)
                    with autocast():
                        _, loss = step_model(x, y)
                    (loss / t.grad_accum).backward()
                    loss_sum += loss.detach()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                tokens += tokens_per_step
                window_tokens += tokens_per_step
                progress.advance(step)

                if step % t.log_interval == 0 or step == t.max_steps:
                    # the only host sync of a step; NaN/inf stops the run here, naming the step
                    train_loss = check_finite(distributed.mean(loss_sum) / t.grad_accum, step, run_dir)
                    elapsed = time.time() - window_start
                    tps = window_tokens / max(elapsed, 1e-9)
                    metrics = {"train/loss": train_loss, "train/lr": lr, "train/grad_norm": float(grad_norm),
                               "train/tokens_per_s": tps}
                    if peak:
                        metrics["train/mfu"] = tps * flops_per_token / peak
                    if step % t.eval_interval == 0 or step == t.max_steps:
                        val = evaluate()
                        metrics.update(val)
                    tracker.log({**metrics, "elapsed_s": time.time() - loop_start}, step=step, tokens=tokens)
                    progress.update(step, train_loss, val.get("val/ppl"), tps)
                    window_start, window_tokens = time.time(), 0
                elif step % t.eval_interval == 0:
                    val = evaluate()
                    tracker.log({**val, "elapsed_s": time.time() - loop_start}, step=step, tokens=tokens)
                # under DDP ranks agree on a signal at log steps only: no collective per step
                at_log_step = step % t.log_interval == 0 or step == t.max_steps
                stopping = (at_log_step or not distributed.active()) and distributed.any_rank(stop.received is not None)
                if step % t.checkpoint_interval == 0 or step == t.max_steps or stopping:
                    check_finite(loss_sum, step, run_dir)  # never replace a good checkpoint with a diverged one
                    if distributed.is_main():
                        save_checkpoint(run_dir, model, optimizer, scheduler, batches, step, tokens, cfg,
                                        tracker.wandb_id, val)
                if stopping:
                    stop.stop(run_dir, step)  # SIGTERM / Ctrl-C: checkpoint saved, metrics flushed

        train_seconds = time.time() - loop_start  # the loop alone (a resumed run counts its earlier part)
        lengths = []  # perplexity at eval.lengths × seq_len (Press et al.), same tokens for each
        if cfg.eval.get("at_end", True):
            lengths = extrapolation.run_from_config(model, data.validation, cfg, device, autocast, on_result=_log_length)
            tracker.log(extrapolation.metrics(lengths), step=step, tokens=tokens)
        wall = time.time() - started
        summary = {
            "status": "completed",
            **val,
            "steps": step,
            "tokens": tokens,
            "params": n_params,
            "wall_time_s": wall,
            "tokens_per_s": tokens / max(train_seconds, 1e-9),  # training loop, not setup or final eval
            "seq_len": t.seq_len,
            "encoding": encoding_summary(model.encoding),
            "device": str(device),
            "precision": precision,
            **(extrapolation.summary(lengths, cfg.eval.get("stride")) if lengths else {}),
        }
        if tracker.enabled:  # rank 0 holds metrics.jsonl
            summary.update(convergence_metrics(read_jsonl(run_dir / METRICS_FILE), t.get("convergence_targets")))
        tracker.summary(summary)
        exit_code = 0
        return summary
    finally:
        tracker.finish(exit_code)


def _log_length(r: extrapolation.LengthResult) -> None:
    log.info("extrapolation: length %d (%g×): %s", r.length, r.multiple, f"ppl {r.ppl:.3f}" if r.ppl else r.reason)
