"""What the CLI settles before Hydra runs: which directory a run writes to.

- ``trainer.resume=<run dir>`` (or ``auto`` / ``true``: the newest run under outputs/ with
  the same overrides and a checkpoint) continues in that directory: the CLI points Hydra's
  ``hydra.run.dir`` at it, so .hydra/, train.log, metrics.jsonl and W&B stay in one place.
- Under torchrun every rank runs the CLI: rank 0 picks the run dir and broadcasts it, so all
  ranks agree on one; the other ranks write no Hydra files of their own.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback

from posenc.train import distributed
from posenc.rundir import checkpoint_path
from posenc.errors import UserError

MULTIRUN_FLAGS = ("-m", "--multirun")
NO_RESUME = ("false", "null", "none", "")


def _value(args: list[str], key: str) -> str | None:
    for a in args:
        if a.lstrip("+~").startswith(key + "="):
            return a.split("=", 1)[1]
    return None


def _task_overrides(args: list[str]) -> list[str]:
    """The overrides that define the run (not Hydra's own, not resume, not flags)."""
    return sorted(a for a in args if "=" in a and not a.startswith("-") and not a.startswith("hydra")
                  and not a.lstrip("+~").startswith("trainer.resume="))


def find_resumable(outputs: Path, args: list[str]) -> Path:
    """The newest run dir under outputs/ with a checkpoint and the same overrides as args."""
    wanted = _task_overrides(args)
    candidates = []
    for overrides in outputs.rglob(".hydra/overrides.yaml"):
        run_dir = overrides.parent.parent
        ckpt = checkpoint_path(run_dir)
        if ckpt.is_file() and _task_overrides(yaml.safe_load(overrides.read_text()) or []) == wanted:
            candidates.append((ckpt.stat().st_mtime, run_dir))
    if not candidates:
        raise UserError(f"trainer.resume=auto: no run under {outputs}/ with these overrides has a checkpoint — "
                        f"pass trainer.resume=<run dir>, or start a new run without trainer.resume")
    return max(candidates)[1]


def resume_dir(args: list[str], cwd: Path) -> Path | None:
    """The run dir trainer.resume names (checked to exist and hold a checkpoint), or None."""
    value = _value(args, "trainer.resume")
    if value is None or value.strip("'\"").lower() in NO_RESUME:
        return None
    value = value.strip("'\"")
    if any(a in MULTIRUN_FLAGS for a in args):
        raise UserError("trainer.resume works on one run, not a -m sweep — resume each job's run dir on its own")
    if value.lower() in ("auto", "true"):
        return find_resumable(cwd / "outputs", args)
    run_dir = Path(value).expanduser()
    if not run_dir.is_dir():
        raise UserError(f"trainer.resume: run dir '{run_dir}' does not exist — pass a directory under outputs/ "
                        f"(or trainer.resume=auto for the latest matching run)")
    if not checkpoint_path(run_dir).is_file():
        raise UserError(f"trainer.resume: '{run_dir}' has no checkpoints/last.pt — it saved no checkpoint; "
                        f"start a new run")
    return run_dir.resolve()


def _quote(path: str) -> str:
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def prepare_args(args: list[str], cwd: Path | None = None) -> list[str]:
    """Hydra overrides with the run dir fixed where resume or torchrun need it."""
    cwd = cwd or Path.cwd()
    multirun = any(a in MULTIRUN_FLAGS for a in args)
    if multirun:  # Hydra's parser wants the flag before the overrides; users put it anywhere
        args = ["-m", *(a for a in args if a not in MULTIRUN_FLAGS)]
    fixed = _value(args, "hydra.run.dir") is not None
    out = list(args)
    if multirun:  # submitit jobs fail in their own processes: the sweep's summaries tell
        out.append("+hydra.callbacks.sweep_failures._target_=posenc.cli.launch.SweepFailures")
    # our launcher presets extend the plugin's schema of the same name, which Hydra 1.3 still merges
    warnings.filterwarnings("ignore", message=r"(?s).*ConfigStore schema with the same name")
    run_dir = resume_dir(args, cwd) if not fixed else None
    if run_dir is not None:
        out.append(f"hydra.run.dir={_quote(str(run_dir))}")
        fixed = True
    if distributed.launched() and not multirun:
        distributed.init()
        if not fixed:
            # Hydra's own pattern, with the time taken once on rank 0 (encoding.name still resolves)
            stamp = distributed.broadcast(datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f"))
            out.append(f"hydra.run.dir=outputs/{stamp}_${{encoding.name}}")
        if not distributed.is_main():
            out += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    return out


class SweepFailures(Callback):
    """At the end of a sweep, read the jobs' summary.json files: a launcher that runs jobs in
    other processes (submitit) cannot report their failures to the CLI any other way."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from posenc.cli import hydra_entry as entry

        if entry.FAILED_JOBS:  # jobs ran in this process and reported themselves
            return
        for summary in sorted(Path(config.hydra.sweep.dir).glob("*/summary.json")):
            result = json.loads(summary.read_text())
            if result.get("status") == "failed":
                entry.FAILED_JOBS.append(f"{summary.parent.name} ({' '.join(result.get('overrides', []))}): "
                                         f"{result.get('error')}")
