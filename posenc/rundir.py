"""A run directory and a sweep directory: their layout, atomic writes, reading them back.

A run directory (Hydra's output dir) holds ``.hydra/`` (the composed config and the
overrides), ``train.log``, ``metrics.jsonl`` (one JSON object per log step), ``summary.json``
(written once, at the end, atomically), ``checkpoints/last.pt`` and ``wandb/``. A sweep lands in
``outputs/sweeps/<date>/<time with µs>_<name>/<job.num>_<encoding>`` (conf/config.yaml); Hydra
writes the composed sweep config to ``multirun.yaml``, and the first job to start writes
``sweep.json``: the name, when it started, the overrides, the sweeper and the launcher.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from posenc.errors import UserError

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
SWEEP_FILE = "sweep.json"
CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("version", "model", "optimizer", "scheduler", "sampler", "rng", "step", "tokens", "config")


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / "last.pt"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temp file and rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


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


def remove_run_dir(run_dir: Path) -> None:
    """Delete a run dir and any parents (up to outputs/) that it leaves empty."""
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = run_dir.parent
    while parent.name and parent.name != "outputs":
        try:
            parent.rmdir()  # only succeeds when empty
        except OSError:
            break
        parent = parent.parent


def has_results(run_dir: Path) -> bool:
    metrics = run_dir / METRICS_FILE
    return (metrics.exists() and metrics.stat().st_size > 0) or checkpoint_path(run_dir).exists()


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_group(sweep_dir: Path) -> str:
    """A sweep's W&B group: `<name>-<date>-<time>` from its directory, unique per sweep."""
    time_name = sweep_dir.name
    stamp, _, name = time_name.partition("_")
    return f"{name or 'sweep'}-{sweep_dir.parent.name}-{stamp}"


def wandb_group(configured: str | None) -> str | None:
    """logger.group if set; else, in a sweep, the sweep's group, so every job shares it."""
    if configured:
        return configured
    return sweep_group(Path(HydraConfig.get().sweep.dir)) if in_multirun() else None


def record_sweep(sweep_dir: Path) -> None:
    """Write sweep.json once per sweep (exclusive create: the first job wins, others skip)."""
    hc = HydraConfig.get()
    # multirun.yaml (Hydra's, written before any job) holds the sweep's own overrides;
    # a job's HydraConfig only knows the job's
    multirun = sweep_dir / "multirun.yaml"
    overrides = list(OmegaConf.load(multirun).hydra.overrides.task) if multirun.exists() else []
    meta = {
        "name": sweep_dir.name.partition("_")[2] or "sweep",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["posenc", "train", "-m", *overrides]),
        "overrides": overrides,
        "sweeper": OmegaConf.to_container(hc.sweeper, resolve=True),
        "launcher": OmegaConf.to_container(hc.launcher, resolve=True),
        "group": sweep_group(sweep_dir),
    }
    try:
        fd = os.open(sweep_dir / SWEEP_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, indent=2, default=str)
        f.write("\n")


def read_sweep(sweep_dir: Path) -> dict | None:
    path = sweep_dir / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else None
