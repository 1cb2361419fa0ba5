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
import signal
import threading
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posenc.errors import UserError

#: bump when the checkpoint layout changes incompatibly
CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("version", "model", "optimizer", "scheduler", "sampler", "rng", "step", "tokens", "config")
#: config sections that must equal the checkpoint's for the weights and batches to make sense
MUST_MATCH = ("model", "encoding", "tokenizer", "dataset", "seed", "trainer.seq_len", "trainer.batch_size",
              "trainer.grad_accum")


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / "last.pt"


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


def save_checkpoint(run_dir: Path, model, optimizer, scheduler, batches, step: int, tokens: int,
                    cfg: DictConfig, wandb_id: str | None, val: dict | None = None) -> Path:
    """checkpoints/last.pt, written to a temp file and renamed: the last good one survives."""
    path = checkpoint_path(run_dir)
    path.parent.mkdir(exist_ok=True)
    metrics = Path(run_dir) / "metrics.jsonl"
    state = {
        "version": CHECKPOINT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": batches.state_dict(),
        "rng": rng_state(),
        "step": step,
        "tokens": tokens,
        "val": dict(val or {}),
        "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "wandb_id": wandb_id,
    }
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: Path | str) -> dict:
    """Read a checkpoint (a file, or a run dir holding checkpoints/last.pt); a missing, corrupt
    or foreign file is a UserError saying so."""
    path = Path(path)
    if path.is_dir():
        path = checkpoint_path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at '{path}' — the run saved none yet (see trainer.checkpoint_interval); "
                        f"start a new run instead")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - truncated zip, pickle garbage, wrong file type...
        raise UserError(f"checkpoint '{path}' is corrupt or unreadable ({type(e).__name__}) — "
                        f"delete it and resume from an earlier copy, or start a new run") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise UserError(f"'{path}' is not a posenc checkpoint — point at a run dir made by `posenc train`")
    if state["version"] != CHECKPOINT_VERSION:
        raise UserError(f"checkpoint '{path}' has format v{state['version']}, this posenc reads "
                        f"v{CHECKPOINT_VERSION} — use the posenc version that wrote it, or start a new run")
    return state


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


def restore_model(model: torch.nn.Module, state: dict, path: Path | str) -> None:
    """Load the checkpoint's weights into model; a shape or key mismatch is a UserError."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise UserError(f"checkpoint '{path}' does not fit this model ({first}) — "
                        f"use the model/encoding settings it was trained with") from None


def truncate_metrics(run_dir: Path, size: int) -> None:
    """Drop metrics.jsonl rows written after the checkpoint: they will be logged again."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > size:
        with open(metrics, "r+b") as f:
            f.truncate(size)


class Resumed:
    """What the loop continues from: step, tokens, last validation metrics, the W&B id."""

    def __init__(self, step: int = 0, tokens: int = 0, val: dict | None = None, wandb_id: str | None = None):
        self.step, self.tokens, self.val, self.wandb_id = step, tokens, dict(val or {}), wandb_id


def resume_training(run_dir: Path, cfg: DictConfig, model, optimizer, scheduler, batches) -> Resumed:
    """Restore every piece of state from run_dir's checkpoint (in place) for an exact resume."""
    path = checkpoint_path(run_dir)
    state = load_checkpoint(path)
    check_compatible(state, cfg, path)
    restore_model(model, state, path)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    batches.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    truncate_metrics(run_dir, state.get("metrics_bytes", 0))
    return Resumed(state["step"], state["tokens"], state.get("val"), state.get("wandb_id"))


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
        resume = f"posenc train trainer.resume={run_dir}"
        raise RunInterrupted(f"stopped by {self.name} at step {step}; checkpoint saved in "
                             f"{checkpoint_path(run_dir)} — continue with `{resume}`")
