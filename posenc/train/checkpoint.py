"""Checkpoints and exact resume.

``checkpoints/last.safetensors`` holds everything the training loop needs to continue as if it
had never stopped: model, optimizer, scheduler, the RNG states (torch, CUDA, numpy, python), the
data sampler's generator, step and tokens, the last validation metrics, the byte length of
metrics.jsonl at that step (rows written after it are dropped on resume, so no step is
logged twice), the W&B run id and the resolved config. Tensors are stored as safetensors and
the rest as JSON (posenc/record/statefile.py): opening a shared run directory cannot run code. It is
written to a temp file and renamed, so a crash mid-write leaves the previous good checkpoint.

``trainer.checkpoint`` says what a run keeps (Checkpoints):

- ``last`` (default): ``checkpoints/last.safetensors`` every ``trainer.checkpoint_interval`` steps, at the
  end and on SIGTERM / Ctrl-C. `posenc eval` reads it; resume continues from it.
- ``best``: ``checkpoints/best.safetensors``, saved at each evaluation that lowers val/loss (the
  same format, so `posenc eval` reads it). While the run is unfinished ``last.safetensors`` is kept
  too, so an interrupted run resumes exactly; it is deleted when the run completes, leaving the
  best alone (a completed ``best`` run cannot be extended).
- ``none``: nothing is saved; the run cannot be resumed or evaluated later.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posenc.build import restore_weights
from posenc.display.commands import command, override
from posenc.errors import UserError
from posenc.record.rundir import RunDir
from posenc.record.statefile import CHECKPOINT_VERSION, save_state
from posenc.train.progress import to_log_files
from posenc.train.state import TrainState

log = logging.getLogger("posenc")

#: config sections that must equal the checkpoint's for the weights and batches to make sense
MUST_MATCH = ("model", "encoding", "tokenizer", "dataset", "seed", "trainer.seq_len", "trainer.batch_size",
              "trainer.grad_accum")


class TrainingDiverged(UserError, RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunInterrupted(UserError):
    """SIGTERM or Ctrl-C: a checkpoint was saved and the run can be resumed."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's convention: 130 after Ctrl-C, 143 after SIGTERM


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
                    val: dict | None = None, kind: str = "last", best_val_loss: float = math.inf) -> Path:
    """checkpoints/<kind>.safetensors, written to a temp file and renamed: the last good one survives."""
    run = RunDir(run_dir)
    path = run.checkpoint(kind)
    path.parent.mkdir(exist_ok=True)
    metrics = run.metrics_file
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
        "best_val_loss": best_val_loss,  # trainer.checkpoint=best: the val/loss best checkpoint holds, for resume
    }
    save_state(saved, path)
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
    metrics = RunDir(run_dir).metrics_file
    if metrics.exists() and metrics.stat().st_size > size:
        with open(metrics, "r+b") as f:
            f.truncate(size)


@dataclass
class Resumed:
    """What the loop continues from besides the TrainState: last validation metrics, the W&B id."""

    val: dict = field(default_factory=dict)
    wandb_id: str | None = None
    best_val_loss: float = math.inf


def resume_training(run_dir: Path, cfg: DictConfig, state: TrainState) -> Resumed:
    """Restore every piece of the TrainState (in place) and the RNGs from run_dir's checkpoint,
    for an exact resume."""
    run = RunDir(run_dir)
    path = run.checkpoint()
    saved = run.load_checkpoint("last")
    check_compatible(saved, cfg, path)
    restore_weights(state.model, saved, path)
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.batches.load_state_dict(saved["sampler"])
    state.step, state.tokens = saved["step"], saved["tokens"]
    set_rng_state(saved["rng"])
    truncate_metrics(run_dir, saved.get("metrics_bytes", 0))
    log.info("resumed at step %d (%s tokens) from %s", state.step, f"{state.tokens:,}", path)
    return Resumed(dict(saved.get("val") or {}), saved.get("wandb_id"), saved.get("best_val_loss", math.inf))


class Checkpoints:
    """What trainer.checkpoint keeps (last | best | none; see the module docstring)."""

    def __init__(self, run_dir: Path, kind: str, best_val_loss: float = math.inf) -> None:
        self.run_dir, self.kind, self.best_val_loss = Path(run_dir), kind, best_val_loss

    def evaluated(self, state: TrainState, cfg: DictConfig, wandb_id: str | None, val: dict) -> None:
        """After an evaluation: checkpoints/best.safetensors when val/loss is the lowest yet (kind best)."""
        loss = val.get("val/loss")
        if self.kind == "best" and loss is not None and loss < self.best_val_loss:
            self.best_val_loss = loss
            save_checkpoint(self.run_dir, state, cfg, wandb_id, val, "best", loss)

    def save(self, state: TrainState, cfg: DictConfig, wandb_id: str | None, val: dict) -> None:
        """At a checkpoint step or a stop: checkpoints/last.safetensors, what resume continues from (kinds last, best)."""
        if self.kind != "none":
            save_checkpoint(self.run_dir, state, cfg, wandb_id, val, "last", self.best_val_loss)

    def finish(self) -> dict:
        """At the end of a completed run: drop the last checkpoint if only the best is kept; return what is
        kept, for summary.json: kind, paths (relative to the run dir), bytes, MB."""
        run = RunDir(self.run_dir)
        if self.kind == "best":
            run.checkpoint().unlink(missing_ok=True)
        kept = [p for p in (run.checkpoint("best"), run.checkpoint()) if p.is_file()]
        size = sum(p.stat().st_size for p in kept)
        return {"kind": self.kind, "paths": [str(p.relative_to(self.run_dir)) for p in kept],
                "bytes": size, "mb": round(size / 2**20, 2)}


def check_finite(loss: torch.Tensor | float, step: int, run_dir: Path) -> float:
    """The step's loss as a float; NaN or inf stops the run, naming the step."""
    value = float(loss)
    if not math.isfinite(value):
        kept = RunDir(run_dir).checkpoint()
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

    def stop(self, run_dir: Path, step: int, saved: bool = True) -> None:
        if not saved:
            raise RunInterrupted(f"stopped by {self.name} at step {step}; trainer.checkpoint=none kept no checkpoint, "
                                 f"so it cannot be resumed — start a new run (with trainer.checkpoint=last to resume)",
                                 self.received or signal.SIGINT)
        resume = command("posenc train", override("trainer.resume", run_dir))  # the run's overrides are restored
        message = (f"stopped by {self.name} at step {step}; checkpoint saved in {RunDir(run_dir).checkpoint()} — "
                   f"continue with `{resume}`")
        to_log_files(f"interrupted: {message}")  # train.log says why it ends here (the console gets the error line)
        raise RunInterrupted(message, self.received or signal.SIGINT)
