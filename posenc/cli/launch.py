"""What the CLI settles before Hydra runs: which directory a run writes to.

- ``trainer.resume=<run dir>`` (or ``auto`` / ``true``: the newest run under outputs/ with
  the same overrides and a checkpoint) continues in that directory: the CLI points Hydra's
  ``hydra.run.dir`` at it, so .hydra/, train.log, metrics.jsonl and W&B stay in one place.
- The run dir is the source of truth for a resume: the run's own task overrides
  (.hydra/overrides.yaml) are restored, so ``posenc train trainer.resume=<run dir>`` alone
  continues it exactly. An override that would change the experiment is refused; only
  ``MAY_CHANGE_ON_RESUME`` may differ. A refused or no-op resume (the checkpoint is already at
  trainer.max_steps) is settled here, before Hydra rewrites .hydra/: it writes nothing.
- ``-m trainer.resume=<sweep dir>`` resumes a sweep in its directory: the sweep's overrides are
  restored and each job continues as it left off (posenc/cli/sweep.py).
- Under torchrun every rank runs the CLI: rank 0 picks the run dir and broadcasts it, so all
  ranks agree on one; the other ranks write no Hydra files of their own.

Every override is read by Hydra's own parser (posenc.config.parse_overrides).
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime
from pathlib import Path

import typer
from omegaconf import OmegaConf

from posenc.cli.hydra_argv import parse_args
from posenc.cli.sweep import resume_overrides
from posenc.config import ParsedOverride, parse_overrides
from posenc.display.commands import command, hydra_value, override
from posenc.errors import UserError
from posenc.record import provenance
from posenc.record.rundir import RunDir

RESUME_KEY = "trainer.resume"
INIT_FROM_KEY = "trainer.init_from"  # posenc.train.init_from.KEY
NO_RESUME = (False, None, "false", "none", "")

#: what a resume may change (a key, or a group with all its keys): how long, how often it
#: evaluates/logs/saves, where it runs, where it reports. Anything else would change the experiment.
MAY_CHANGE_ON_RESUME = ("trainer.max_steps", "trainer.eval_interval", "trainer.early_evals", "trainer.log_interval",
                        "trainer.checkpoint_interval", "trainer.checkpoint", "trainer.allow_code_change",
                        "trainer.resume_reshape", "device", "logger", "eval", "check")


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
    candidates = [(run.checkpoint().stat().st_mtime, run.path) for run in RunDir.under(outputs)
                  if run.overrides_file.is_file() and run.checkpoint().is_file()
                  and _task_overrides(parse_overrides(run.overrides())) == wanted]
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
        raise UserError("trainer.resume with -m resumes a sweep — pass its dir: -m trainer.resume=<sweep dir>")
    if value is True or str(value).lower() in ("auto", "true"):
        return find_resumable(cwd / "outputs", overrides)
    return RunDir(Path(str(value)).expanduser()).require_checkpoint(
        "trainer.resume", "pass a directory under outputs/ (or trainer.resume=auto for the latest matching run)")


def _may_change(key: str) -> bool:
    return any(key == k or key.startswith((k + ".", k + "/")) for k in MAY_CHANGE_ON_RESUME)


def _is_own(key: str) -> bool:
    """Hydra's keys and trainer.resume itself: not part of what the run is."""
    return key.startswith("hydra") or key == RESUME_KEY


def _run_value(key: str, config: dict, choices: dict):
    """The run's value of a config key, or its choice of a group (encoding, model, ...)."""
    if key in choices:
        return choices[key]
    return OmegaConf.select(OmegaConf.create(config), key, default=None)


def restore_run_overrides(run: RunDir | Path, argv_overrides: list[str]) -> list[str]:
    """The run's own task overrides, then the resume command's, which may only change
    MAY_CHANGE_ON_RESUME keys. A change to anything else is refused, and a run already at
    trainer.max_steps exits 0 here: either way, before Hydra writes into the run dir."""
    run = RunDir.of(run)
    # start-up: a resume reads its checkpoint with torch; a new run loads torch once its config was checked
    from posenc.train import distributed
    from posenc.train.checkpoint import RESHAPE_KEY, RESHAPE_KEYS, check_world

    run_dir = run.path
    saved_parsed = [o for o in parse_overrides(run.overrides()) if not _is_own(o.key)]
    new_parsed = parse_overrides(argv_overrides)
    # the last checkpoint (a resume never continues from the best)'s step and config: its header only,
    # the training loop reads its tensors once
    ckpt = run.load_checkpoint("last", tensors=False)
    # the run's values: its saved overrides, else its group choices, else its last checkpoint's config
    choices = run.choices()
    saved_values = {k: v for k, v, _ in saved_parsed}

    def run_value(key: str):
        return saved_values[key] if key in saved_values else _run_value(key, ckpt["config"], choices)

    # trainer.resume_reshape=true: the processes and how the global batch is made may change too
    reshape = _value(new_parsed, RESHAPE_KEY)
    reshape = reshape is True or str(reshape).lower() == "true"
    changed = [f"{k}={v} (the run has {run_value(k)})" for k, v, _ in new_parsed
               if not _is_own(k) and not _may_change(k) and v != run_value(k) and not (reshape and k in RESHAPE_KEYS)]
    if changed:
        raise UserError(f"trainer.resume: {run_dir} was not run with {', '.join(changed)} — a resume continues "
                        f"the same experiment and may only change {', '.join(MAY_CHANGE_ON_RESUME)}; "
                        f"start a new run to change anything else")
    # the number of processes is part of the run (training checks the global batch once composed)
    check_world(ckpt, run_dir, distributed.requested_world_size(), reshape=reshape)

    max_steps = _value(new_parsed, "trainer.max_steps")
    if max_steps is None:
        max_steps = run_value("trainer.max_steps")
    step = ckpt["step"]
    if isinstance(max_steps, int) and step > max_steps:
        raise UserError(f"trainer.resume: {run_dir} is already at step {step}, past trainer.max_steps={max_steps} — "
                        f"pass a larger trainer.max_steps to extend it")
    if step == max_steps:
        further = command("posenc train", override(RESUME_KEY, run_dir), f"trainer.max_steps={step * 2}")
        print(f"{run_dir} is complete ({step} steps); to train it further (trainer.max_steps > {step}): {further}")
        raise typer.Exit(0)

    # one override per key (Hydra refuses a group chosen twice): the run's, replaced by the command's
    merged: dict[str, str] = {o.key: o.override.input_line for o in saved_parsed}
    for o in new_parsed:
        merged.pop(o.key, None)
    return [*merged.values(), *argv_overrides]


def check_code(run: RunDir, overrides: list[ParsedOverride]) -> None:
    """A resume composes the run with the plugin config dirs it was made with, and continues only
    with the encoding code it started with, unless trainer.allow_code_change=true says go on."""

    provenance.restore_config_dirs(run)
    changed = provenance.changes(run)
    allowed = _value(overrides, provenance.ALLOW_KEY)
    if changed and not (allowed is True or str(allowed).lower() == "true"):
        raise UserError(f"trainer.resume: the encoding code changed since {run.path} started: {'; '.join(changed)} — "
                        f"restore that code, or pass {provenance.ALLOW_KEY}=true to continue with today's")


def prepare(argv: list[str], cwd: Path | None = None) -> argparse.Namespace:
    """argv as Hydra reads it, with the run dir fixed where resume or torchrun need it."""
    cwd = cwd or Path.cwd()
    args = parse_args(argv)
    overrides = parse_overrides(args.overrides)
    resumed = _value(overrides, RESUME_KEY)
    if args.multirun and not (resumed in NO_RESUME or str(resumed).lower() in NO_RESUME):
        # a sweep resumes in its own directory: its overrides restored, each job as it left it (cli/sweep.py)
        args.overrides = resume_overrides((cwd / str(resumed)).expanduser(), args.overrides, _may_change)
        return args
    fixed = _value(overrides, "hydra.run.dir") is not None
    run_dir = resume_dir(overrides, bool(args.multirun), cwd) if not fixed else None
    if run_dir is not None:
        run = RunDir(run_dir)  # its provenance, overrides and choices read once
        check_code(run, overrides)
        args.overrides = restore_run_overrides(run, args.overrides)
        args.overrides.append(f"hydra.run.dir={hydra_value(run_dir)}")
        fixed = True
    if any(o.key == INIT_FROM_KEY for o in parse_overrides(args.overrides)):
        from posenc.train import init_from  # start-up: torch, only for a run that starts from a parent

        args.overrides = init_from.parent_overrides(args.overrides)  # scaling extends from the parent's seq_len
    if os.environ.get("WORLD_SIZE", "1") == "1" or args.multirun:  # no torchrun: torch waits until the config is checked
        return args
    from posenc.train import distributed  # start-up: under torchrun (WORLD_SIZE > 1) every rank joins first

    if distributed.launched():
        distributed.init()
        if not fixed:
            # Hydra's own pattern, with the time taken once on rank 0 (encoding.name still resolves)
            stamp = distributed.broadcast(datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f"))
            args.overrides.append(f"hydra.run.dir=outputs/{stamp}_${{encoding.name}}")
        if not distributed.is_main():
            args.overrides += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    return args
