"""train(cfg, run_dir) -> summary: the whole training run as a plain function.

The loop around train_step (state.py): logging at log steps (the only host sync), periodic
evaluation on fixed validation windows (posenc.eval.loss), checkpoints as trainer.checkpoint
says (checkpoints/last.safetensors and/or best.safetensors: train/checkpoint.py), SIGTERM / Ctrl-C handling,
metrics to metrics.jsonl and W&B, and at the end the extrapolation evaluation and the summary.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.build import (
    build_data,
    build_model,
    check_encodable,
    encoding_summary,
    seed_everything,
)
from posenc.config import validate as validate_config
from posenc.eval import final
from posenc.eval.loss import validator
from posenc.hardware import machine_load, peak_flops, setup_device
from posenc.record import metrics as M
from posenc.record import provenance
from posenc.record.directory import plain_numbers, wandb_group
from posenc.record.rundir import RunDir
from posenc.record.tracking import Tracker
from posenc.train import distributed, init_from
from posenc.train.checkpoint import (
    Checkpoints,
    GracefulStop,
    Resumed,
    check_finite,
    resume_training,
)
from posenc.train.progress import TrainProgress
from posenc.train.state import TrainState, micro_batches, new_train_state, train_step

log = logging.getLogger("posenc")


def train(cfg: DictConfig, run_dir: Path, checked: bool = False) -> dict:
    """Train one model as cfg says, writing everything into run_dir; return the summary.
    checked: the CLI's pre-check (cli/hydra_commands.check_run) already validated this config."""
    if not checked:
        validate_config(cfg)
    started = time.time()
    seed_everything(cfg.seed)  # the model's init depends on the seed alone, as in `posenc bench`
    # the run's one encoding build, refused here before any data is read; the data draws from
    # generators of its own, so building it next leaves the model's init as if built first
    encoding = check_encodable(cfg)
    if distributed.is_main():  # where the encoding's code came from: eval, probe and resume compare it
        provenance.write(run_dir, cfg)
    log.info("run dir: %s", run_dir)  # named first: a run stopped early is found without waiting for its end
    device, precision, autocast = setup_device(cfg.device, cfg.trainer.precision)  # as eval, probe, bench
    t = cfg.trainer

    data = build_data(cfg)
    model = build_model(cfg, data.vocab_size, encoding)
    parent = init_from.start_from_parent(cfg, model, run_dir, write=distributed.is_main())  # {} without init_from
    model = model.to(device)
    encoding = plain_numbers(encoding_summary(model.encoding))  # base=10000 as typed, not 10000.0
    log.info("model: %s params, encoding %s, device %s, precision %s", f"{model.num_params():,}",
             ", ".join(f"{k}={v}" for k, v in encoding.items()), device, precision)
    # a corpus's random windows (cut as dataset.packing says) or generated task instances
    batches = data.batches(t.seq_len, t.batch_size, seed=cfg.seed, rank=distributed.rank(),
                           world_size=distributed.world_size())
    state = new_train_state(model, t, batches, device, autocast)
    resumed = resume_training(run_dir, cfg, state) if t.get("resume") else Resumed()
    evaluate = validator(model, data, t, device, autocast)  # the same held-out batches at every evaluation

    tracker = Tracker(run_dir, enabled=distributed.is_main())  # rank 0 alone writes the run's files
    exit_code = 1
    try:
        if cfg.logger.name == "wandb":
            start_wandb(tracker, cfg, model.encoding.name, run_dir, resumed.wandb_id)
        checkpoints = Checkpoints(run_dir, t.checkpoint, resumed.best_val_loss)
        val, train_seconds = run_loop(state, cfg, run_dir, tracker, evaluate, resumed.val,
                                      rate=Throughput(model.flops_per_token(t.seq_len), peak_flops(device, t.get("peak_flops"))),
                                      checkpoints=checkpoints)
        # perplexity at eval.lengths × seq_len (Press et al.) or task accuracy, and per-position loss
        evaluated = final.evaluate_run(model, data, cfg, run_dir, tracker, state.step, state.tokens, device, autocast) \
            if cfg.eval.at_end else {}
        summary = {
            "status": "completed",
            **val,
            M.STEPS.name: state.step,
            M.TOKENS_SEEN.name: state.tokens,
            M.PARAMS.name: model.num_params(),
            M.WALL_TIME.name: time.time() - started,
            M.TOKENS_PER_S.name: state.tokens / max(train_seconds, 1e-9),  # training loop, not setup or final eval
            **machine_load(),  # was the machine busy while tokens/s was measured? (the report flags it)
            **run_facts(cfg, model, data, encoding, device, precision),
            "checkpoint": checkpoints.finish() if distributed.is_main() else {"kind": t.checkpoint},
            **parent,
            **evaluated,
        }
        if tracker.enabled:  # rank 0 holds metrics.jsonl
            summary.update(M.convergence_metrics(RunDir(run_dir).metrics(), t.get("convergence_targets")))
        tracker.summary(summary)
        exit_code = 0
        return summary
    finally:
        tracker.finish(exit_code)


def start_wandb(tracker: Tracker, cfg: DictConfig, encoding_name: str, run_dir: Path, run_id: str | None) -> None:
    """The run's W&B run (resumed under its id when the run resumes), tagged with its encoding."""
    lc = cfg.logger
    group = wandb_group(lc.group)
    config = OmegaConf.to_container(cfg, resolve=True)  # W&B shows nested keys flat: encoding.base
    config["logger"]["group"] = group  # the group the run is in (a sweep's own where logger.group is unset)
    tracker.start_wandb(
        config=config,
        project=lc.project, mode=lc.mode, group=group, job_type=lc.job_type,
        tags=[encoding_name, *list(lc.tags or [])], name=run_dir.name, entity=lc.entity, run_id=run_id,
    )


def run_facts(cfg: DictConfig, model, data, encoding: dict, device, precision: str) -> dict:
    """What the summary records about the run's setup: length, encoding, layout, packing, device."""
    return {
        "seq_len": cfg.trainer.seq_len,
        "encoding": encoding,
        "layout": model.layout.describe(),
        "packing": getattr(data, "packing", None),  # how the training windows were cut (a corpus)
        "device": str(device),
        "precision": precision,
    }


class Throughput:
    """tokens/s over the window since the last log step, and MFU where the peak is known."""

    def __init__(self, flops_per_token: float, peak: float | None) -> None:
        self.flops_per_token, self.peak = flops_per_token, peak
        self.start, self.tokens = time.time(), 0

    def metrics(self) -> dict[str, float]:
        tps = self.tokens / max(time.time() - self.start, 1e-9)
        out = {M.TRAIN_TOKENS_PER_S.name: tps}
        if self.peak:
            out[M.TRAIN_MFU.name] = tps * self.flops_per_token / self.peak
        return out

    def restart(self) -> None:
        self.start, self.tokens = time.time(), 0


def run_loop(state: TrainState, cfg: DictConfig, run_dir: Path, tracker: Tracker,
             evaluate: Callable[[], dict[str, float]], val: dict[str, float], rate: Throughput,
             checkpoints: Checkpoints) -> tuple[dict, float]:
    """train_step until trainer.max_steps: log, evaluate, checkpoint, stop on a signal.
    Returns the last validation metrics and the seconds of training (a resumed run included)."""
    t = cfg.trainer
    # elapsed_s in every row: seconds of training (a resumed run continues its clock), for convergence
    loop_start = rate.start - (M.elapsed_before(RunDir(run_dir).metrics(), state.step)
                               if state.step and tracker.enabled else 0.0)
    if t.max_steps == 0 and distributed.is_main():  # nothing to train: evaluate and save the model as it starts
        val = evaluate()
        checkpoints.evaluated(state, cfg, tracker.wandb_id, val)
        checkpoints.save(state, cfg, tracker.wandb_id, val)
    with TrainProgress(t.max_steps, enabled=distributed.is_main()) as progress, GracefulStop() as stop:
        while state.step < t.max_steps:
            tokens_before = state.tokens
            result = train_step(state, micro_batches(state))
            step = state.step
            rate.tokens += state.tokens - tokens_before
            progress.advance(step)
            at_log_step = step % t.log_interval == 0 or step == t.max_steps
            at_eval_step = is_eval_step(step, t.max_steps, t.eval_interval, t.early_evals)  # denser early

            if at_log_step:
                # the only host sync of a step; NaN/inf stops the run here, naming the step
                train_loss = check_finite(distributed.mean(result.loss), step, run_dir)
                row = {M.TRAIN_LOSS.name: train_loss, M.TRAIN_LR.name: result.lr,
                       M.TRAIN_GRAD_NORM.name: float(result.grad_norm), **rate.metrics()}  # before eval: tokens/s excludes it
            if at_eval_step:
                val = evaluate()
                if distributed.is_main():
                    checkpoints.evaluated(state, cfg, tracker.wandb_id, val)
            if at_log_step:
                tracker.log({**row, **(val if at_eval_step else {}), M.ELAPSED.name: time.time() - loop_start},
                            step=step, tokens=state.tokens)
                progress.update(step, train_loss, val.get(M.VAL_PPL.name), row[M.TRAIN_TOKENS_PER_S.name],
                                tokens=state.tokens, lr=result.lr)
                rate.restart()
            elif at_eval_step:
                tracker.log({**val, M.ELAPSED.name: time.time() - loop_start}, step=step, tokens=state.tokens)
            if at_eval_step:
                progress.evaluated(step, val)
            # under DDP ranks agree on a signal at log steps only: no collective per step
            stopping = (at_log_step or not distributed.active()) and distributed.any_rank(stop.received is not None)
            if step % t.checkpoint_interval == 0 or step == t.max_steps or stopping:
                check_finite(result.loss, step, run_dir)  # never replace a good checkpoint with a diverged one
                if distributed.is_main():
                    checkpoints.save(state, cfg, tracker.wandb_id, val)
            if stopping:
                # SIGTERM / Ctrl-C: checkpoint saved (unless trainer.checkpoint=none), metrics flushed
                stop.stop(run_dir, step, saved=checkpoints.kind != "none")
    return val, time.time() - loop_start


# --- when the loop evaluates ------------------------------------------------------------------
# When the training loop evaluates: denser early, where the loss falls fastest.
#
# A loss curve drops steeply in its first few hundred steps, which is where tokens-to-loss
# targets are usually crossed; evaluating only every ``trainer.eval_interval`` steps leaves few
# points there. So over the first ``2·eval_interval`` steps the loop evaluates
# ``trainer.early_evals`` times per interval (default 4: steps 13, 25, 38, 50, 63, 75, 88, 100
# for eval_interval=50), then every ``eval_interval`` steps, and always at the last step.
# ``early_evals=1`` gives evenly spaced evaluations. Each evaluation scores the same
# ``eval_batches·batch_size`` windows, so the extra early points cost
# ``2·(early_evals-1)`` evaluations per run, whatever its length.


def early_eval_steps(eval_interval: int, early_evals: int) -> set[int]:
    """The steps in (0, 2·eval_interval] at k·eval_interval/early_evals, rounded half up."""
    per = max(1, int(early_evals))
    return {max(1, math.floor(k * eval_interval / per + 0.5)) for k in range(1, 2 * per + 1)}


def is_eval_step(step: int, max_steps: int, eval_interval: int, early_evals: int = 1) -> bool:
    """Whether the loop evaluates after this step."""
    if step % eval_interval == 0 or step == max_steps:
        return True
    return step <= 2 * eval_interval and step in early_eval_steps(eval_interval, early_evals)


def eval_schedule(max_steps: int, eval_interval: int, early_evals: int = 1) -> list[int]:
    """Every step the loop evaluates at, in order (for tests and docs; the loop asks is_eval_step)."""
    return [s for s in range(1, max_steps + 1) if is_eval_step(s, max_steps, eval_interval, early_evals)]
