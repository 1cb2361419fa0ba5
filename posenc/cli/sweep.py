"""A sweep (-m) as posenc runs it: Hydra's multirun, stopped whole by one signal, resumed in place.

- **One Ctrl-C (or SIGTERM) stops the sweep.** The job running saves its checkpoint (the training
  loop's GracefulStop) and raises RunInterrupted; in a sweep its task turns that into SweepStopped,
  a KeyboardInterrupt, which Hydra's launchers do not catch (they record an Exception as one failed
  job and start the next). A signal between jobs raises it too. The end says which jobs finished,
  which was interrupted, which never started, and the one command that resumes the sweep.
- **A sweep resumes in its own directory**: ``posenc train -m trainer.resume=<sweep dir>`` restores
  the sweep's overrides from its multirun.yaml and points ``hydra.sweep.dir`` at it; each job finds
  its directory as it left it (prepare_job): a completed job is kept and not re-run, an interrupted
  one continues from its checkpoint, the others start.
- **Jobs that run elsewhere report here.** A launcher that runs the jobs in other processes
  (submitit, SLURM) leaves this process waiting: each job's step, losses and ETA are read from its
  run directory and printed meanwhile (sweep_progress.py).
- **A refused sweep writes nothing.** Hydra's sweeper saves multirun.yaml before it composes the
  jobs, so a job that cannot be composed (an unknown choice, a key one choice lacks) would leave a
  sweep dir holding only that file: run_sweep removes it.

run_sweep is what Hydra's app does for -m, through Hydra's public plugin API (the ConfigLoader, the
sweeper plugin, ``HydraContext``), keeping the sweeper to read which jobs it planned.
"""

from __future__ import annotations

import copy
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from posenc.cli.callbacks import Callbacks
from posenc.cli.common import console
from posenc.cli.sweep_progress import watch_jobs
from posenc.config import parse_overrides
from posenc.display.commands import command, hydra_value, override
from posenc.errors import UserError
from posenc.record.directory import job_dir_name, remove_run_dir
from posenc.record.rundir import MULTIRUN_FILE, RunDir
from posenc.record.sweepdir import SweepDir

log = logging.getLogger("posenc")


class SweepStopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a sweep: the job running kept its checkpoint; no other job starts."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SweepInterrupted(UserError):
    """The one error line of a stopped sweep; exits 130 after Ctrl-C, 143 after SIGTERM."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While a sweep runs, SIGINT and SIGTERM raise SweepStopped (a job's training loop installs
    its own handlers, which save a checkpoint first, and restores these after)."""
    def stop(signum, frame) -> None:
        raise SweepStopped(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_sweep(loader, config_name: str, overrides: list[str], task: Callable[[DictConfig], object]):
    """What Hydra's app does for -m, on its public plugin API: compose the sweep's config with Hydra's
    ConfigLoader, start the configured sweeper (``Plugins.instantiate_sweeper``; it starts the
    configured launcher, any installed one), between the user's on_multirun_start/end callbacks; what
    the sweeper returns. A signal stops it (SweepInterrupted, after the report); a refusal before any
    job started leaves no directory."""
    from hydra.core.plugins import Plugins
    from hydra.core.utils import configure_log
    from hydra.types import HydraContext, RunMode


    cfg = loader.load_configuration(config_name=config_name, overrides=overrides, run_mode=RunMode.MULTIRUN)
    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    callbacks = Callbacks(cfg)
    callbacks.on_multirun_start(config=cfg, config_name=config_name)
    sweeper = Plugins.instance().instantiate_sweeper(
        config=cfg, hydra_context=HydraContext(config_loader=ComposeOnce(loader), callbacks=callbacks),
        task_function=task)
    sweep_dir = Path(str(cfg.hydra.sweep.dir))
    existed = sweep_dir.exists()
    try:
        with stop_on_signals(), watch_jobs(sweep_dir, cfg, say):  # jobs in other processes: their progress here
            returned = sweeper.sweep(arguments=OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False))
    except KeyboardInterrupt as e:  # SweepStopped, or Ctrl-C where no handler of ours was installed
        signum = e.signum if isinstance(e, SweepStopped) else signal.SIGINT
        raise stopped(sweep_dir, planned_jobs(sweeper), cfg, signum) from None
    except Exception:
        if not existed and sweep_dir.is_dir() and [p.name for p in sweep_dir.iterdir()] == [MULTIRUN_FILE]:
            remove_run_dir(sweep_dir)  # refused while composing its jobs: no job ran, nothing to keep
        raise
    callbacks.on_multirun_end(config=cfg, config_name=config_name)
    return returned


def say(line: str) -> None:
    """One progress line of a sweep's job, whole, never read as markup."""
    console.print(line, highlight=False, soft_wrap=True, markup=False)


class ComposeOnce:
    """Hydra's config loader (the ConfigLoader interface sweepers and launchers use), composing each
    job of a sweep once. The basic sweeper composes every job of a batch to refuse a bad one before
    any starts, then its launcher composes each again to run it (hydra-core 1.3, 1.4): the second is
    a copy of the first (~0.3 s a job saved)."""

    def __init__(self, loader) -> None:
        self._loader = loader
        self._jobs: dict[tuple[int, tuple[str, ...]], DictConfig] = {}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        key = (id(master_config), tuple(sweep_overrides))
        if key not in self._jobs:
            self._jobs[key] = self._loader.load_sweep_config(master_config, list(sweep_overrides))
        return copy.deepcopy(self._jobs[key])  # the launcher writes the job's id and number into it

    def __getattr__(self, name: str):
        if name.startswith("_"):  # unpickling (a submitit launcher ships it) looks these up first
            raise AttributeError(name)
        return getattr(self._loader, name)


def planned_jobs(sweeper) -> list[list[str]] | None:
    """Each job's overrides, in job order, as the basic sweeper planned them (None: a sweeper that
    does not say, e.g. an optimiser choosing the next job from the last)."""
    batches = getattr(sweeper, "overrides", None)
    return [list(job) for batch in batches for job in batch] if batches else None


# --- the end of a stopped sweep ------------------------------------------------------------
def job_state(run: RunDir | None) -> tuple[str, str]:
    """(state, detail): finished, failed, interrupted (at which step: a checkpoint to continue
    from), or never started."""
    if run is None:
        return "never started", ""
    status = (run.summary() or {}).get("status")
    if status == "completed":
        return "finished", ""
    if run.checkpoint().is_file():
        step = run.load_checkpoint("last", tensors=False)["step"]
        return ("failed" if status == "failed" else "interrupted"), f"checkpoint at step {step}"
    return ("failed" if status == "failed" else "interrupted"), "no checkpoint: it starts over"


def stopped(sweep_dir: Path, jobs: list[list[str]] | None, cfg: DictConfig, signum: int) -> SweepInterrupted:
    """Print each job's state and the command that resumes the sweep; the error that ends it."""

    shown = display_path(sweep_dir)
    resume = command("posenc train -m", override("trainer.resume", shown))
    exclude = list(cfg.hydra.job.config.override_dirname.exclude_keys or [])
    by_state: dict[str, list[str]] = {}
    sweep = SweepDir(sweep_dir)
    nums = range(len(jobs)) if jobs is not None else sweep.job_numbers()
    for num in nums:
        run = sweep.job(num)
        name = run.path.name.split("_", 1)[1] if run else job_dir_name(jobs[num], exclude, "?") if jobs else "?"
        state, detail = job_state(run)
        by_state.setdefault(state, []).append(f"job {num} ({name})" + (f", {detail}" if detail else ""))
    name = signal.Signals(signum).name
    console.print(f"sweep stopped by {name}: {shown}", highlight=False, soft_wrap=True)
    for state in ("finished", "failed", "interrupted", "never started"):
        if state in by_state:
            console.print(f"  {state}: {'; '.join(by_state[state])}", highlight=False, soft_wrap=True)
    if jobs is None:
        console.print("  (this sweeper does not say which jobs it would have run next)", highlight=False, soft_wrap=True)
    console.print(f"resume the sweep: {resume}", highlight=False, soft_wrap=True)
    return SweepInterrupted(f"sweep stopped by {name} ({len(by_state.get('finished', []))} of "
                            f"{len(list(nums))} jobs finished) — resume it with `{resume}`", signum)


def display_path(path: Path) -> Path:
    """path relative to the working directory where it lies under it (as Hydra wrote it), else absolute."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path.resolve()


# --- resuming a sweep in place -------------------------------------------------------------
def prepare_job(cfg: DictConfig, run_dir: Path, write: bool = True) -> dict | None:
    """A sweep job whose directory exists already (a resumed sweep): its summary if it completed
    (not re-run); else cfg set to resume from its checkpoint, or its leftovers cleared to start over
    (where ``write``: rank 0 of a job of several tasks; the others decide alike, from what they read)."""
    run = RunDir(run_dir)
    summary = run.summary()
    if summary is not None and summary.get("status") == "completed":
        log.info("%s completed already: kept, not re-run", run_dir)
        return summary
    if run.checkpoint().is_file():
        with open_dict(cfg):
            cfg.trainer.resume = True  # training continues from its last checkpoint
    elif write:  # a job that stopped before its first checkpoint, or failed before one: it starts over
        run.discard_results()
    return None


def resume_overrides(sweep_dir: Path, argv_overrides: list[str], may_change: Callable[[str], bool]) -> list[str]:
    """The overrides that resume the sweep in sweep_dir: its own (multirun.yaml), the command's
    (which may change only what may_change allows, or Hydra's keys: where it runs), and its directory."""

    saved = SweepDir(sweep_dir).saved_overrides()
    if saved is None:
        raise UserError(f"trainer.resume with -m takes a sweep dir (one holding {MULTIRUN_FILE}); '{sweep_dir}' is not "
                        f"one — pass outputs/sweeps/<date>/<time>_<name>, or drop -m to resume one run")
    ours = ("hydra.mode", "hydra.sweep.dir", "hydra.job.config.override_dirname.exclude_keys")
    kept = [o for o in parse_overrides(list(saved.hydra)) if o.key not in ours] + parse_overrides(list(saved.task))
    new = [o for o in parse_overrides(argv_overrides) if o.key != "trainer.resume"]
    values = {o.key: o.value for o in kept}
    changed = [f"{o.key}={o.value} (the sweep has {values.get(o.key)})" for o in new
               if not o.key.startswith("hydra") and not may_change(o.key) and values.get(o.key) != o.value]
    if changed:
        raise UserError(f"trainer.resume: the sweep in {sweep_dir} was not run with {', '.join(changed)} — a resume "
                        f"continues the same sweep; start a new sweep to change it")
    replaced = {o.key for o in new}
    return [*(o.override.input_line for o in kept if o.key not in replaced), *(o.override.input_line for o in new),
            f"hydra.sweep.dir={hydra_value(sweep_dir)}"]  # Hydra's quoting alone: these never pass a shell
