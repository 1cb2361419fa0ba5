"""What the CLI settles before Hydra runs: which directory a run writes to.

- ``trainer.resume=<run dir>`` (or ``auto`` / ``true``: the newest run under outputs/ with
  the same overrides and a checkpoint) continues in that directory: the CLI points Hydra's
  ``hydra.run.dir`` at it, so .hydra/, train.log, metrics.jsonl and W&B stay in one place.
- Under torchrun every rank runs the CLI: rank 0 picks the run dir and broadcasts it, so all
  ranks agree on one; the other ranks write no Hydra files of their own.

Every override is read by Hydra's own parser (posenc.config.parse_overrides).
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

import yaml

from posenc.cli.hydra_entry import parse_args
from posenc.config import ParsedOverride, parse_overrides
from posenc.errors import UserError
from posenc.rundir import checkpoint_path
from posenc.train import distributed

RESUME_KEY = "trainer.resume"
NO_RESUME = (False, None, "false", "none", "")


def _value(overrides: list[ParsedOverride], key: str):
    """The value the last override of key sets, or None."""
    return next((value for k, value, _ in reversed(overrides) if k == key), None)


def _task_overrides(overrides: list[ParsedOverride]) -> list[tuple[str, object]]:
    """What defines a run: (key, value) of every override but Hydra's own and resume, sorted."""
    return sorted(((k, v) for k, v, _ in overrides if not k.startswith("hydra") and k != RESUME_KEY),
                  key=lambda kv: kv[0])


def find_resumable(outputs: Path, overrides: list[ParsedOverride]) -> Path:
    """The newest run dir under outputs/ with a checkpoint and the same overrides."""
    wanted = _task_overrides(overrides)
    candidates = []
    for saved in outputs.rglob(".hydra/overrides.yaml"):
        run_dir = saved.parent.parent
        ckpt = checkpoint_path(run_dir)
        if ckpt.is_file() and _task_overrides(parse_overrides(yaml.safe_load(saved.read_text()) or [])) == wanted:
            candidates.append((ckpt.stat().st_mtime, run_dir))
    if not candidates:
        raise UserError(f"trainer.resume=auto: no run under {outputs}/ with these overrides has a checkpoint — "
                        f"pass trainer.resume=<run dir>, or start a new run without trainer.resume")
    return max(candidates)[1]


def resume_dir(overrides: list[ParsedOverride], multirun: bool, cwd: Path) -> Path | None:
    """The run dir trainer.resume names (checked to exist and hold a checkpoint), or None."""
    value = _value(overrides, RESUME_KEY)
    if value in NO_RESUME or (isinstance(value, str) and value.lower() in NO_RESUME):
        return None
    if multirun:
        raise UserError("trainer.resume works on one run, not a -m sweep — resume each job's run dir on its own")
    if value is True or str(value).lower() in ("auto", "true"):
        return find_resumable(cwd / "outputs", overrides)
    run_dir = Path(str(value)).expanduser()
    if not run_dir.is_dir():
        raise UserError(f"trainer.resume: run dir '{run_dir}' does not exist — pass a directory under outputs/ "
                        f"(or trainer.resume=auto for the latest matching run)")
    if not checkpoint_path(run_dir).is_file():
        raise UserError(f"trainer.resume: '{run_dir}' has no checkpoints/last.pt — it saved no checkpoint; "
                        f"start a new run")
    return run_dir.resolve()


def _quote(path: str) -> str:
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def prepare(argv: list[str], cwd: Path | None = None) -> argparse.Namespace:
    """argv as Hydra reads it, with the run dir fixed where resume or torchrun need it."""
    cwd = cwd or Path.cwd()
    args = parse_args(argv)
    overrides = parse_overrides(args.overrides)
    fixed = _value(overrides, "hydra.run.dir") is not None
    run_dir = resume_dir(overrides, bool(args.multirun), cwd) if not fixed else None
    if run_dir is not None:
        args.overrides.append(f"hydra.run.dir={_quote(str(run_dir))}")
        fixed = True
    if distributed.launched() and not args.multirun:
        distributed.init()
        if not fixed:
            # Hydra's own pattern, with the time taken once on rank 0 (encoding.name still resolves)
            stamp = distributed.broadcast(datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f"))
            args.overrides.append(f"hydra.run.dir=outputs/{stamp}_${{encoding.name}}")
        if not distributed.is_main():
            args.overrides += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    return args
