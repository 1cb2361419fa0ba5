"""A sweep (Hydra multirun): its directory, its metadata file, its W&B group.

A sweep lands in ``outputs/sweeps/<date>/<time with µs>_<name>/<job.num>_<encoding>``
(conf/config.yaml). Hydra writes the composed sweep config to ``multirun.yaml``; the first
job to start also writes ``sweep.json``: the name, when it started, the command-line
overrides, the sweeper's parameters and the launcher, readable without Hydra.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

SWEEP_FILE = "sweep.json"


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
