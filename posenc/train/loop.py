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

import torch
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
from posenc.eval.loss import global_batch, validator
from posenc.hardware import choose_cpu_threads, machine_load, peak_flops, setup_device
from posenc.record import metrics as M
from posenc.record import provenance
from posenc.record.directory import plain_numbers, wandb_group
from posenc.record.proofs import RECORDS
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


def train(cfg: DictConfig, run_dir: Path, checked: bool = False, verdict: dict | None = None) -> dict:
    """Train one model as cfg says, writing everything into run_dir; return the summary.
    checked: the CLI's pre-check (cli/hydra_commands.check_run) already validated this config;
    verdict: `posenc check`'s on the encoding (posenc/check/verdict.py), recorded in the summary."""
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
    if not t.get("resume"):  # a loaded machine's CPU run: as many threads as cores are free (a resume keeps its own)
        choose_cpu_threads(device)

    data = build_data(cfg)
    model = build_model(cfg, data.vocab_size, encoding)
    parent = init_from.start_from_parent(cfg, model, run_dir, write=distributed.is_main())  # {} without init_from
    model = model.to(device)
    encoding = plain_numbers(encoding_summary(model.encoding))  # base=10000 as typed, not 10000.0
    log.info("model: %s params, encoding %s, device %s, precision %s", f"{model.num_params():,}",
             ", ".join(f"{k}={v}" for k, v in encoding.items()), device, precision)
    state, resumed, evaluate = training_parts(cfg, run_dir, model, data, device, autocast, parent)

    tracker = Tracker(run_dir, enabled=distributed.is_main())  # rank 0 alone writes the run's files
    exit_code = 1
    try:
        if cfg.logger.name == "wandb":
            start_wandb(tracker, cfg, model.encoding.name, run_dir, resumed.wandb_id)
        checkpoints = Checkpoints(run_dir, t.checkpoint, resumed.best_val_loss, resumed.reshapes, resumed.proofs)
        events = FallbackEvents(state, tracker)
        val, train_seconds = run_loop(state, cfg, run_dir, tracker, evaluate, resumed.val,
                                      rate=Throughput(model.flops_per_token(t.seq_len), peak_flops(device, t.get("peak_flops"))),
                                      checkpoints=checkpoints, events=events)
        # perplexity at eval.lengths × seq_len (Press et al.) or task accuracy, and per-position loss
        evaluated = final.evaluate_run(model, data, cfg, run_dir, tracker, state.step, state.tokens, device, autocast) \
            if cfg.eval.at_end else {}
        events.log()  # one in the last evaluations: at the last step
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
            **how_it_ran(state, verdict, checkpoints, cfg),
            "checkpoint": share_checkpoint(tracker, cfg, checkpoints.finish(), run_dir, state.step)
            if distributed.is_main() else {"kind": t.checkpoint},
            **parent,
            **evaluated,
        }
        if tracker.enabled:  # rank 0 holds metrics.jsonl
            summary.update(M.convergence_metrics(RunDir(run_dir).metrics(), t.get("convergence_targets")))
        tracker.describe("kernels", summary["kernels"])  # W&B's config and summary (summary.json: below)
        tracker.summary(summary)
        exit_code = 0
        return summary
    finally:
        tracker.finish(exit_code)


def training_parts(cfg: DictConfig, run_dir: Path, model: torch.nn.Module, data, device: torch.device,
                   autocast, parent: dict) -> tuple[TrainState, Resumed, Callable[[], dict]]:
    """The train state (resumed where trainer.resume says, else its parent's proof first) and its validation."""
    t = cfg.trainer
    # a corpus's random windows (cut as dataset.packing says) or generated task instances
    batches = data.batches(t.seq_len, t.batch_size, seed=cfg.seed, rank=distributed.rank(),
                           world_size=distributed.world_size())
    state = new_train_state(model, t, batches, device, autocast)
    resumed = resume_training(run_dir, cfg, state, say=True) if t.get("resume") else Resumed(proofs=init_from.proofs(parent))
    # the same held-out windows at every evaluation, eval_batches × the global batch, shared out over the ranks
    evaluate = validator(model, data, t, device, autocast, rank=distributed.rank(),
                         world_size=distributed.world_size(), reduce=distributed.sum_over_ranks)
    return state, resumed, evaluate


def how_it_ran(state: TrainState, verdict: dict | None, checkpoints: Checkpoints, cfg: DictConfig) -> dict:
    """What changes a run's numbers beside its config, for the summary and W&B: each layer kind's kernel
    path, compiled or not, and every fallback; `posenc check`'s verdict on the encoding; the resumes that
    changed the processes or the global batch; each rebuild of the model from a checkpoint compared with
    it, the one eval reads rebuilt now (rank 0: eval/proof.py)."""
    proofs = checkpoints.prove(cfg, state) if distributed.is_main() else []
    return {"kernels": state.kernels.record(), **verdict_facts(verdict), "reshapes": checkpoints.reshapes,
            RECORDS: proofs}


def start_wandb(tracker: Tracker, cfg: DictConfig, encoding_name: str, run_dir: Path, run_id: str | None) -> None:
    """The run's W&B run (resumed under its id when the run resumes), tagged with its encoding,
    in its group: logger.group (a study spanning sweeps), else its sweep's; the config W&B holds
    names the group used, so a runs table filters and groups by logger.group too."""
    lc = cfg.logger
    config = OmegaConf.to_container(cfg, resolve=True)  # W&B shows nested keys flat: encoding.base
    group = wandb_group(lc.group)
    config["logger"]["group"] = group
    tracker.start_wandb(
        config=config, project=lc.project, mode=lc.mode, group=group, job_type=lc.job_type,
        tags=[encoding_name, *list(lc.tags or [])], name=run_dir.name, entity=lc.entity, run_id=run_id,
    )


def share_checkpoint(tracker: Tracker, cfg: DictConfig, kept: dict, run_dir: Path, step: int) -> dict:
    """logger.log_checkpoint=true: the checkpoint the run kept, logged to W&B as a model artifact
    (``model-<W&B run id>``, aliases: the kind kept and ``step-<n>``) with the files that make a
    folder a run dir (its .hydra/ config, overrides and choices; its provenance; an init_from
    parent), so the artifact downloaded is a run dir `posenc eval` reads; what summary.json says it kept."""
    if not cfg.logger.get("log_checkpoint") or not kept.get("paths") or tracker.wandb_id is None:
        return kept
    run = RunDir(run_dir)
    files = [run_dir / p for p in kept["paths"]] + [p for p in (run.config_file, run.overrides_file, run.hydra_file,
                                                              run.provenance_file, run.parent_file) if p.is_file()]
    metadata = {"encoding": cfg.encoding.get("name"), "step": step, "run_dir": run_dir.name,
                "kind": kept["kind"], "config": OmegaConf.to_container(cfg, resolve=True)}
    name = tracker.log_model(files, f"model-{tracker.wandb_id}", metadata, aliases=[kept["kind"], f"step-{step}"])
    return {**kept, "wandb_artifact": name}


def run_facts(cfg: DictConfig, model, data, encoding: dict, device, precision: str) -> dict:
    """What the summary records about the run's setup: length, encoding, layout, packing, device."""
    return {
        "seq_len": cfg.trainer.seq_len,
        "encoding": encoding,
        "layout": model.layout.describe(),
        "packing": getattr(data, "packing", None),  # how the training windows were cut (a corpus)
        "corpus": data.counts() if hasattr(data, "counts") else None,  # its tokens and documents per split
        "device": str(device),
        "precision": precision,
        # how the steps were taken: processes, and windows per optimizer step (the same at N processes
        # as at one with N× trainer.batch_size: the same losses, the same validation)
        "world_size": distributed.world_size(),
        "global_batch": global_batch(cfg.trainer, distributed.world_size()),
        M.MACHINE_THREADS.name: torch.get_num_threads(),  # a CPU step's sums change in their last bits with it
    }


def verdict_facts(verdict: dict | None) -> dict:
    """`posenc check`'s verdict as the summary records it, and as one string W&B's summary takes."""
    if verdict is None:
        return {}
    return {"check": verdict, "check/failed": "; ".join(verdict["failed"]) if verdict["holds"] is not None else None}


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


class FallbackEvents:
    """The run's kernel fallbacks as metrics.jsonl events, each once, at the step it happened in (one in an
    evaluation: the step it followed)."""

    def __init__(self, state: TrainState, tracker: Tracker) -> None:
        self.state, self.tracker, self.logged = state, tracker, 0

    def log(self) -> None:
        policy = self.state.kernels
        policy.stamp(self.logged, self.state.step)
        for fallback in policy.fallbacks[self.logged:]:
            self.tracker.event("kernels/fallback", fallback.as_dict(), step=fallback.step, tokens=self.state.tokens)
        self.logged = len(policy.fallbacks)


def run_loop(state: TrainState, cfg: DictConfig, run_dir: Path, tracker: Tracker,
             evaluate: Callable[[], dict[str, float]], val: dict[str, float], rate: Throughput,
             checkpoints: Checkpoints, events: FallbackEvents) -> tuple[dict, float]:
    """train_step until trainer.max_steps: log, evaluate, checkpoint, stop on a signal.
    Returns the last validation metrics and the seconds of training (a resumed run included)."""
    t = cfg.trainer
    # elapsed_s in every row: seconds of training (a resumed run continues its clock), for convergence
    loop_start = rate.start - (M.elapsed_before(RunDir(run_dir).metrics(), state.step)
                               if state.step and tracker.enabled else 0.0)
    if t.max_steps == 0:  # nothing to train: evaluate (every rank its share) and save the model as it starts
        val = evaluate()
        if distributed.is_main():
            checkpoints.evaluated(state, cfg, tracker.wandb_id, val)
            checkpoints.save(state, cfg, tracker.wandb_id, val)
    with TrainProgress(t.max_steps, enabled=distributed.is_main()) as progress, GracefulStop() as stop:
        while state.step < t.max_steps:
            tokens_before = state.tokens
            result = train_step(state, micro_batches(state))
            step = state.step
            events.log()  # a kernel that fell back in this step: an event at it
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
                events.log()  # one in the evaluation (an eager FlexAttention call): at the step it followed
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


# --- when the loop evaluates: denser early, where the loss falls fastest ------------------------
# A loss curve drops steeply in its first few hundred steps, which is where tokens-to-loss
# targets are usually crossed; evaluating only every ``trainer.eval_interval`` steps leaves few
# points there. So over the first ``2·eval_interval`` steps the loop evaluates
# ``trainer.early_evals`` times per interval (default 4: steps 13, 25, 38, 50, 63, 75, 88, 100
# for eval_interval=50), then every ``eval_interval`` steps, and always at the last step.
# ``early_evals=1`` gives evenly spaced evaluations. Each evaluation scores the same
# ``eval_batches`` × global-batch windows, so the extra early points cost
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
