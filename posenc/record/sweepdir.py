"""A sweep directory (Hydra's multirun): Hydra's ``multirun.yaml`` (the sweep's composed config,
written before any job), posenc's ``sweep.json`` (the name, when it started, the overrides, the
sweeper and the launcher: written by the first job to start) and one run directory per job,
``<job.num>_<swept values>`` (conf/config.yaml; its names: posenc/record/directory.py). File names
come from posenc/record/rundir.py, the one module that spells them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.record.directory import sweep_group
from posenc.record.rundir import MULTIRUN_FILE, SWEEP_FILE, RunDir


class SweepDir:
    """One sweep directory: its files and its jobs' run directories."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.multirun_file = self.path / MULTIRUN_FILE
        self.sweep_file = self.path / SWEEP_FILE

    def saved_overrides(self) -> DictConfig | None:
        """multirun.yaml's hydra.overrides (``task``: the sweep's own, ``hydra``: Hydra's), or None
        where Hydra wrote none."""
        return OmegaConf.load(self.multirun_file).hydra.overrides if self.multirun_file.is_file() else None

    def job(self, num: int) -> RunDir | None:
        """Job num's run directory (``<num>_<its values>``), or None: it never started."""
        found = next((p for p in self.path.glob(f"{num}_*") if p.is_dir()), None)
        return RunDir(found) if found is not None else None

    def job_numbers(self) -> list[int]:
        """The numbers of the jobs that started, in order."""
        return sorted(int(p.name.split("_")[0]) for p in self.path.glob("[0-9]*_*"))

    def info(self) -> dict | None:
        """sweep.json (None: no job of the sweep started)."""
        return json.loads(self.sweep_file.read_text()) if self.sweep_file.exists() else None

    def record(self, added: tuple[str, ...] | list[str] = ()) -> None:
        """Write sweep.json once per sweep, from within a job (exclusive create: the first job wins,
        the others skip). added: overrides posenc added to the user's (the sweep's name=), in
        ``overrides`` (what Hydra ran) but not in ``command`` (what the user typed)."""
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        # multirun.yaml (Hydra's, written before any job) holds the sweep's own overrides;
        # a job's HydraConfig only knows the job's
        saved = self.saved_overrides()
        overrides = list(saved.task) if saved is not None else []
        meta = {
            "name": self.path.name.partition("_")[2] or "sweep",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(["posenc", "train", "-m", *(o for o in overrides if o not in set(added))]),
            "overrides": overrides,
            "sweeper": OmegaConf.to_container(hc.sweeper, resolve=True),
            "launcher": OmegaConf.to_container(hc.launcher, resolve=True),
            "group": sweep_group(self.path),
        }
        try:  # 0o644: a data file, not a program (os.open's default mode is 0o777)
            fd = os.open(self.sweep_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f, indent=2, default=str)
            f.write("\n")
