"""train(cfg, run_dir) -> summary: the whole training run as a plain function.

AdamW (decoupled weight decay on matrices only), linear warmup then cosine decay, gradient
clipping, gradient accumulation, periodic evaluation on fixed validation windows, a
checkpoint at ``checkpoints/last.pt``, metrics to metrics.jsonl and W&B.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from posenc.convergence import convergence_metrics
from posenc.data import RandomWindows, TokenData, load_tokens
from posenc.encodings.base import PositionalEncoding, PositionOutOfRange
from posenc.errors import UserError
from posenc.evaluate import evaluate_loss, loss_metrics
from posenc.hardware import autocast_context, peak_flops, resolve_device, resolve_precision
from posenc.model import GPT
from posenc.progress import TrainProgress
from posenc.sweep import wandb_group
from posenc.tracking import Tracker, read_jsonl, write_json_atomic

log = logging.getLogger("posenc")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_data(cfg: DictConfig) -> TokenData:
    tokenizer = _instantiate(cfg.tokenizer, "tokenizer")
    corpus = _instantiate(cfg.dataset, "dataset")
    return load_tokens(corpus, tokenizer, log=log.info)


def build_encoding(cfg: DictConfig) -> PositionalEncoding:
    return _instantiate(cfg.encoding, "encoding", d_model=cfg.model.d_model, n_head=cfg.model.n_head)


def build_model(cfg: DictConfig, vocab_size: int) -> GPT:
    encoding = build_encoding(cfg)
    return _instantiate(cfg.model, "model", vocab_size=vocab_size, encoding=encoding)


def _instantiate(node: DictConfig, group: str, **kwargs):
    """Hydra instantiate, with a bad value reported as a user error naming the group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError)):
            raise UserError(f"{group}: {cause}") from None
        raise


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


def validate(cfg: DictConfig) -> None:
    """Refuse out-of-range training settings before anything is built."""
    t = cfg.trainer
    for key in ("seq_len", "batch_size", "grad_accum", "max_steps", "eval_interval", "eval_batches", "log_interval"):
        if t[key] <= 0:
            raise UserError(f"trainer.{key} must be positive, got {t[key]}")
    if t.lr <= 0:
        raise UserError(f"trainer.lr must be positive, got {t.lr}")
    if t.warmup_steps < 0:
        raise UserError(f"trainer.warmup_steps must be >= 0, got {t.warmup_steps}")


def encoding_summary(encoding: PositionalEncoding) -> dict:
    return {"name": encoding.name, **encoding.options()}


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train one model as cfg says, writing everything into run_dir; return the summary."""
    validate(cfg)
    started = time.time()
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.trainer.precision, device)
    autocast = autocast_context(precision, device)
    seed_everything(cfg.seed)
    t = cfg.trainer

    data = build_data(cfg)
    model = build_model(cfg, data.vocab_size)
    try:
        model.encoding.check_length(t.seq_len)
    except PositionOutOfRange as e:
        raise UserError(str(e)) from None
    model.to(device)
    n_params = model.num_params()
    flops_per_token = model.flops_per_token(t.seq_len)
    peak = peak_flops(device, cfg.trainer.get("peak_flops"))
    log.info("model: %s params, encoding %s, device %s, precision %s", f"{n_params:,}", model.encoding.extra_repr(), device, precision)

    batches = RandomWindows(data.train, t.seq_len, t.batch_size, seed=cfg.seed)
    optimizer = configure_optimizer(model, t, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.warmup_steps, t.max_steps, t.min_lr_ratio))
    step_model = torch.compile(model) if _use_compile(t.compile, device) else model
    tokens_per_step = t.batch_size * t.seq_len * t.grad_accum
    bytes_per_token = data.bytes_per_token("validation")

    tracker = Tracker(run_dir)
    logger_cfg = cfg.logger
    exit_code = 1
    try:
        if logger_cfg.name == "wandb":
            tracker.start_wandb(
                config=OmegaConf.to_container(cfg, resolve=True),  # W&B shows nested keys flat: encoding.base
                project=logger_cfg.project, mode=logger_cfg.mode, group=wandb_group(logger_cfg.group),
                job_type=logger_cfg.job_type, tags=[model.encoding.name, *list(logger_cfg.tags or [])],
                name=run_dir.name, entity=logger_cfg.entity,
            )

        def evaluate() -> dict[str, float]:
            loss = evaluate_loss(model, data.validation, t.seq_len, t.eval_batches * t.batch_size,
                                 t.batch_size, device, autocast)
            return loss_metrics(loss, bytes_per_token)

        step, tokens = 0, 0
        val: dict[str, float] = {}
        window_start, window_tokens = time.time(), 0
        loop_start = window_start  # elapsed_s in every row: seconds of training, for convergence
        with TrainProgress(t.max_steps) as progress:
            while step < t.max_steps:
                loss_sum = torch.zeros((), device=device)
                for _ in range(t.grad_accum):
                    x, y = batches.next()
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
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
                    train_loss = loss_sum.item() / t.grad_accum  # the only host sync of a step
                    if not math.isfinite(train_loss):
                        raise TrainingDiverged(f"loss is {train_loss} at step {step}")
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
                if step % t.checkpoint_interval == 0 or step == t.max_steps:
                    save_checkpoint(run_dir, model, optimizer, scheduler, batches, step, tokens, cfg, tracker.wandb_id)

        wall = time.time() - started
        summary = {
            "status": "completed",
            **val,
            "steps": step,
            "tokens": tokens,
            "params": n_params,
            "wall_time_s": wall,
            "tokens_per_s": tokens / wall,
            "seq_len": t.seq_len,
            "encoding": encoding_summary(model.encoding),
            "device": str(device),
            "precision": precision,
        }
        summary.update(convergence_metrics(read_jsonl(run_dir / "metrics.jsonl"), t.get("convergence_targets")))
        tracker.summary(summary)
        exit_code = 0
        return summary
    finally:
        tracker.finish(exit_code)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def _use_compile(setting, device: torch.device) -> bool:
    """trainer.compile: true | false | auto (on for CUDA, off for CPU)."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)


def save_checkpoint(run_dir: Path, model: GPT, optimizer, scheduler, batches: RandomWindows,
                    step: int, tokens: int, cfg: DictConfig, wandb_id: str | None) -> Path:
    """checkpoints/last.pt, written to a temp file and renamed: the last good one survives."""
    directory = run_dir / "checkpoints"
    directory.mkdir(exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": batches.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "step": step,
        "tokens": tokens,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "wandb_id": wandb_id,
    }
    path = directory / "last.pt"
    tmp = directory / "last.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


__all__ = ["train", "build_model", "build_data", "save_checkpoint", "write_json_atomic"]
