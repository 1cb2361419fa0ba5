"""Checkpoints and exact resume.

``checkpoints/last.pt`` holds everything the training loop needs to continue as if it had
never stopped: model, optimizer, scheduler, the RNG states (torch, CUDA, numpy, python), the
data sampler's generator, step and tokens, the last validation metrics, the byte length of
metrics.jsonl at that step (rows written after it are dropped on resume, so no step is
logged twice), the W&B run id and the resolved config. It is written to a temp file and
renamed, so a crash mid-write leaves the previous good checkpoint in place.
"""

from __future__ import annotations

import math
import os
import random
import shlex
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posenc.build import restore_weights
from posenc.errors import UserError
from posenc.rundir import CHECKPOINT_VERSION, METRICS_FILE, checkpoint_path, load_checkpoint
from posenc.train.state import TrainState

#: config sections that must equal the checkpoint's for the weights and batches to make sense
MUST_MATCH = ("model", "encoding", "tokenizer", "dataset", "seed", "trainer.seq_len", "trainer.batch_size",
              "trainer.grad_accum")


class TrainingDiverged(UserError, RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunInterrupted(UserError):
    """SIGTERM or Ctrl-C: a checkpoint was saved and the run can be resumed."""


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, state: TrainState, cfg: DictConfig, wandb_id: str | None,
                    val: dict | None = None) -> Path:
    """checkpoints/last.pt, written to a temp file and renamed: the last good one survives."""
    path = checkpoint_path(run_dir)
    path.parent.mkdir(exist_ok=True)
    metrics = Path(run_dir) / METRICS_FILE
    saved = {
        "version": CHECKPOINT_VERSION,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "sampler": state.batches.state_dict(),
        "rng": rng_state(),
        "step": state.step,
        "tokens": state.tokens,
        "val": dict(val or {}),
        "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "wandb_id": wandb_id,
    }
    tmp = path.with_suffix(".pt.tmp")
    torch.save(saved, tmp)
    os.replace(tmp, path)
    return path


def _select(container: dict, key: str):
    for part in key.split("."):
        if not isinstance(container, dict) or part not in container:
            return None
        container = container[part]
    return container


def check_compatible(state: dict, cfg: DictConfig, path: Path) -> None:
    """Refuse to resume a checkpoint whose model, data or batch shape differ from cfg's."""
    current = OmegaConf.to_container(cfg, resolve=True)
    for key in MUST_MATCH:
        was, now = _select(state["config"], key), _select(current, key)
        if was != now:
            raise UserError(f"checkpoint '{path}' was trained with {key}={was}, but this run has {key}={now} — "
                            f"resume with the run's own settings, or start a new run")


def truncate_metrics(run_dir: Path, size: int) -> None:
    """Drop metrics.jsonl rows written after the checkpoint: they will be logged again."""
    metrics = Path(run_dir) / METRICS_FILE
    if metrics.exists() and metrics.stat().st_size > size:
        with open(metrics, "r+b") as f:
            f.truncate(size)


@dataclass
class Resumed:
    """What the loop continues from besides the TrainState: last validation metrics, the W&B id."""

    val: dict = field(default_factory=dict)
    wandb_id: str | None = None


def resume_training(run_dir: Path, cfg: DictConfig, state: TrainState) -> Resumed:
    """Restore every piece of the TrainState (in place) and the RNGs from run_dir's checkpoint,
    for an exact resume."""
    path = checkpoint_path(run_dir)
    saved = load_checkpoint(path)
    check_compatible(saved, cfg, path)
    restore_weights(state.model, saved, path)
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.batches.load_state_dict(saved["sampler"])
    state.step, state.tokens = saved["step"], saved["tokens"]
    set_rng_state(saved["rng"])
    truncate_metrics(run_dir, saved.get("metrics_bytes", 0))
    return Resumed(dict(saved.get("val") or {}), saved.get("wandb_id"))


def check_finite(loss: torch.Tensor | float, step: int, run_dir: Path) -> float:
    """The step's loss as a float; NaN or inf stops the run, naming the step."""
    value = float(loss)
    if not math.isfinite(value):
        kept = checkpoint_path(run_dir)
        where = f"the last good checkpoint is kept in {kept}" if kept.exists() else "no checkpoint was saved yet"
        raise TrainingDiverged(f"loss is {value} at step {step}; {where} — lower trainer.lr or raise "
                               f"trainer.warmup_steps, then start again")
    return value


class GracefulStop:
    """While active, SIGTERM and the first Ctrl-C only set ``requested``: the loop finishes its
    step, saves a checkpoint and stops. A second Ctrl-C interrupts at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def stop(self, run_dir: Path, step: int) -> None:
        resume = f"posenc train {shlex.quote(f'trainer.resume={run_dir}')}"  # the run's overrides are restored
        raise RunInterrupted(f"stopped by {self.name} at step {step}; checkpoint saved in "
                             f"{checkpoint_path(run_dir)} — continue with `{resume}`")
