"""How `posenc train` enters Hydra: the task function (one job) and the runner that runs it, on
Hydra's public API alone.

Results travel as return values. The task returns the run's summary (a sweep job that fails
returns ``{"status": "failed", "error": ...}`` instead, so the other jobs still run); Hydra
wraps each in a JobReturn, and ``run_hydra`` returns them all, including those of jobs that
a launcher ran in other processes (submitit pickles each JobReturn back). A single run's
exception reaches the CLI as it was raised, for its one `error:` line.

Why not ``@hydra.main`` for the runs: it reads ``sys.argv``, discards the task's return value,
prints (then ``sys.exit(1)``s) any exception unless the ``HYDRA_FULL_ERROR`` environment variable
is set, and composes every run twice (once only to read ``hydra.mode``). So posenc takes Hydra's
steps itself, each through the API Hydra gives its plugins and tools:

- the config: Hydra's ConfigLoader (``GlobalHydra.instance().config_loader()`` under
  ``initialize_config_module``, posenc/config/load.py), composed once, the plugins' config sources
  as ``hydra.searchpath`` (posenc/config/searchpath.py);
- a run: ``hydra.core.utils.run_job``, the call every launcher plugin runs a job with, between the
  user's ``on_run_start``/``on_run_end`` callbacks (posenc/cli/callbacks.py);
- a sweep: the configured sweeper (``Plugins.instantiate_sweeper``), which starts the configured
  launcher, any installed one (posenc/cli/sweep.py: one Ctrl-C stops it whole; it resumes in place;
  a refused one writes nothing);
- `--help`, `--hydra-help`, `--version`, `--cfg`, `--info`, `--shell-completion`: Hydra's own app,
  ``hydra.main``, handed the command line (posenc/cli/hydra_argv.py reads it first).

A sweep is named before Hydra starts it (sweep_naming: its directory from the experiment,
``name=``, or the swept keys; each job's from its swept values, through Hydra's own
override_dirname.exclude_keys; posenc/cli/sweep_names.py), and its end prints where it went and the
`posenc compare` command for it (print_next_step, posenc/cli/job_returns.py).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.types import RunMode
from omegaconf import DictConfig

from posenc.cli.callbacks import Callbacks
from posenc.cli.common import console
from posenc.cli.explain import explain
from posenc.cli.hydra_argv import command_line, shows
from posenc.cli.job_returns import job_returns, print_next_step
from posenc.cli.sweep import SweepStopped, prepare_job, run_sweep
from posenc.cli.sweep_names import sweep_naming, swept_keys
from posenc.config import apply_choice_schemas
from posenc.config.load import hydra_initialized, version_base
from posenc.config.searchpath import (
    CONFIG_PATH,
    add_config_dirs,
    warn_shadowed,
    with_plugin_sources,
)
from posenc.errors import UserError
from posenc.record.directory import remove_run_dir, write_json_atomic
from posenc.record.rundir import RunDir
from posenc.record.sweepdir import SweepDir
from posenc.report.console import print_summary

log = logging.getLogger("posenc")
CONFIG_NAME = "config"


def run_job(cfg: DictConfig, checked: bool = False, added: tuple[str, ...] = ()) -> dict:
    """Train one job; return its summary. A single run re-raises (the CLI prints one line); a
    sweep job records its failure in summary.json and returns it, so one bad job never stops
    the others. checked: run_hydra's check already saw this very config (a single run), so
    training does not validate it again; a sweep's jobs each differ from the config checked.
    added: the overrides posenc added to the sweep's (its name), left out of the command sweep.json records."""

    from posenc.train import distributed  # start-up: torch loads once a job runs, after its config was checked

    # a submitit job of several tasks (hydra.launcher.tasks_per_node > 1) is one run on that many ranks
    with distributed.job_tasks_as_ranks() as ranks:
        if ranks and not distributed.is_main():
            quiet_rank()
        return run_one_job(cfg, checked, added)


def quiet_rank() -> None:
    """A rank but 0 of a submitit job of several tasks: the job's log file (train.log) is rank 0's,
    as under torchrun (Hydra, which opened it in every task, has no setting a task could differ in)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def run_one_job(cfg: DictConfig, checked: bool = False, added: tuple[str, ...] = ()) -> dict:
    """run_job's work, on every rank of the job."""
    # start-up: the training modules load once a job runs, after its config was checked
    from posenc.check.verdict import carried
    from posenc.train import distributed
    from posenc.train.checkpoint import RunInterrupted
    from posenc.train.loop import train

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    warn_shadowed(hc.runtime.choices)  # a sweep job's own choices (said once per process)
    if multirun:
        if distributed.is_main():  # a job of several tasks: rank 0 writes
            SweepDir(hc.sweep.dir).record(added)
        # a resumed sweep: a completed job is kept, an interrupted one continues
        kept = prepare_job(cfg, run_dir, write=distributed.is_main())
        if kept is not None:
            return kept
    try:
        cfg = apply_choice_schemas(cfg)
        # `posenc check`'s verdict on the encoding, before training seeds anything (posenc/check/verdict.py)
        verdict = carried(cfg, bool(cfg.get("check", True))) if distributed.is_main() else None
        summary = train(cfg, run_dir, checked=checked, verdict=verdict)
    except BaseException as e:
        if multirun and isinstance(e, RunInterrupted):  # its checkpoint is saved: the whole sweep stops
            raise SweepStopped(e.signum) from e
        if not multirun or not isinstance(e, Exception):
            if not RunDir(run_dir).has_results() and not cfg.trainer.get("resume") and distributed.is_main():
                remove_run_dir(run_dir)  # nothing worth keeping: leave no half-written run
            raise
        failure = {"status": "failed", "error": explain(e), "overrides": list(hc.overrides.task)}
        log.error("job %s failed: %s", hc.job.num, failure["error"])
        if distributed.is_main():
            write_json_atomic(RunDir(run_dir).summary_file, failure)
        return failure
    if distributed.is_main():
        print_summary(summary, run_dir)
        print_checkpoint(summary.get("checkpoint") or {})
    return summary


def print_checkpoint(kept: dict) -> None:
    """The end-of-run line on what trainer.checkpoint kept, and its size."""

    if kept.get("kind") == "none" or not kept.get("paths"):
        line = "checkpoint: none kept (trainer.checkpoint=none: this run cannot be resumed or evaluated later)"
    else:
        line = f"checkpoint ({kept['kind']}): {', '.join(kept['paths'])}, {kept['mb']:.1f} MB"
    console.print(line, highlight=False, soft_wrap=True)


def run_hydra(args: argparse.Namespace, check: Callable[[DictConfig, bool], None],
              task: Callable[..., object] = run_job) -> list[JobReturn]:
    """Run Hydra as `python app.py ARGS` would, with conf/ as the primary config; return every
    job's JobReturn (none for --help, --cfg, --info, ...). check(cfg, single) sees the composed config of a
    run (or of a sweep's common part) before Hydra creates any directory; a single run is
    composed once, and its task is told (checked=True) that check saw its config."""
    from hydra.core.global_hydra import GlobalHydra

    if args.experimental_rerun is not None:
        raise UserError("--experimental-rerun is not supported by posenc — rerun with the run's overrides")
    if sum([bool(args.run), args.cfg is not None, bool(args.multirun), bool(args.shell_completion),
            args.info is not None]) > 1:
        raise UserError("only one of --run, --multirun, --cfg, --info and --shell-completion can be given")
    config_name = args.config_name or CONFIG_NAME
    if args.config_dir is not None:  # the plugin search path every command has (posenc/config/searchpath.py)
        add_config_dirs([args.config_dir])
    if args.config_path is not None and not args.config_path.startswith("pkg://"):  # from where the command runs
        args.config_path = str(Path(args.config_path).expanduser().resolve())
    # our launcher presets extend the plugin's schema of the same name, which Hydra 1.3 still merges
    warnings.filterwarnings("ignore", message=r"(?s).*ConfigStore schema with the same name")
    overrides = with_plugin_sources(list(args.overrides))
    if shows(args):
        if args.cfg is not None:  # a config that cannot be composed: posenc's one line, not Hydra's report
            with hydra_initialized(args.config_path):
                GlobalHydra.instance().config_loader().load_configuration(
                    config_name=config_name, overrides=overrides, run_mode=RunMode.RUN)
        show(args, list(args.overrides) if args.shell_completion else overrides)  # -sc's are its own words
        return []
    with hydra_initialized(args.config_path):  # Hydra's global state set, as in its app, while it runs
        loader = GlobalHydra.instance().config_loader()
        mode, cfg = compose_once(loader, config_name, overrides, bool(args.multirun))
        warn_shadowed(cfg.hydra.runtime.choices)  # a chosen file that another source also holds
        check(cfg, mode == RunMode.RUN)
        if mode == RunMode.RUN:
            return [run_composed(loader, cfg, config_name, functools.partial(task, checked=True))]
        swept = swept_keys(args.overrides, cfg)
        naming = sweep_naming(args.overrides, swept, cfg)
        overrides += naming
        if task is run_job:  # sweep.json records the command as the user typed it, without posenc's name=
            task = functools.partial(run_job, added=tuple(naming))
        returns = job_returns(run_sweep(loader, config_name, overrides, task))  # the sweeper's, stopped whole by a signal
        print_next_step(returns, swept)
        return returns


def compose_once(loader, config_name: str, overrides: list[str], multirun: bool) -> tuple[RunMode, DictConfig]:
    """The run mode and the composed config (overrides gains hydra.mode where -m or the default
    decides it). A config may set hydra.mode itself (an experiment that is always a sweep):
    without -m a run is composed once as a run and becomes a sweep only if its config says so
    (Hydra's own app composes every run a second time just to read that)."""
    def compose(mode: RunMode, validate_sweep_overrides: bool = True) -> DictConfig:
        return loader.load_configuration(config_name=config_name, overrides=overrides, run_mode=mode,
                                         validate_sweep_overrides=validate_sweep_overrides)

    if multirun:
        overrides.append(f"hydra.mode={RunMode.MULTIRUN.name}")
        return RunMode.MULTIRUN, compose(RunMode.MULTIRUN)
    try:
        cfg = compose(RunMode.RUN)
    except Exception:  # a sweep override (a,b) without -m: an error unless the config is always a sweep
        try:  # the config's own hydra.mode, read as Hydra's app reads it (sweep overrides not checked)
            configured = compose(RunMode.MULTIRUN, validate_sweep_overrides=False).hydra.mode
        except Exception:  # noqa: BLE001 - the first error is the one to report
            configured = None
        if configured != RunMode.MULTIRUN:
            raise
        return RunMode.MULTIRUN, compose(RunMode.MULTIRUN)
    if cfg.hydra.mode == RunMode.MULTIRUN:
        return RunMode.MULTIRUN, compose(RunMode.MULTIRUN)
    overrides.append(f"hydra.mode={RunMode.RUN.name}")
    cfg.hydra.mode = RunMode.RUN  # as the override would have set it, and as Hydra's app does
    return RunMode.RUN, cfg


def run_composed(loader, cfg: DictConfig, config_name: str, task: Callable[[DictConfig], object]) -> JobReturn:
    """One run of a config already composed, as Hydra's app runs it: Hydra's logging, the user's
    callbacks around ``run_job`` (the call launcher plugins make), and a failed job's exception
    raised as it is (HeldError)."""
    from hydra.core.utils import configure_log
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext


    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    held = HeldError(task)
    returned = hydra_run_job(hydra_context=HydraContext(config_loader=loader, callbacks=callbacks),
                             task_function=held, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                             configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=returned)
    held.reraise()
    return returned


def show(args: argparse.Namespace, overrides: list[str]) -> None:
    """--help, --hydra-help, --version, --cfg, --info, --shell-completion: what Hydra's own app
    prints, by Hydra's own app (``hydra.main``) handed this command line; nothing runs, nothing is
    written. ``hydra.main`` reads its command line from ``sys.argv``, so it is set for the call."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    @hydra.main(config_path=CONFIG_PATH, config_name=CONFIG_NAME, **version_base())
    def app(cfg: DictConfig) -> None:
        raise AssertionError("Hydra ran a job for a flag that only shows")  # never: these flags run nothing

    GlobalHydra.instance().clear()  # Hydra's app sets its own, and refuses to start over another's
    argv = sys.argv
    sys.argv = ["posenc train", *command_line(argparse.Namespace(**{**vars(args), "overrides": overrides}))]
    try:
        app()
    except SystemExit as e:  # --help, --hydra-help and --version exit 0; Hydra printed any error itself
        if e.code not in (0, None):
            raise
    finally:
        sys.argv = argv


class HeldError:
    """A single run's task, holding its exception until the run's callbacks are done, then raised as
    it is: ``run_job`` would keep an Exception in the JobReturn, whose ``return_value`` prints
    "Error executing job with overrides: [...]" to stderr before re-raising it (a second line beside
    posenc's one `error:` line), and a Ctrl-C would skip on_run_end."""

    def __init__(self, task: Callable[[DictConfig], object]) -> None:
        self.task, self.error = task, None

    def __call__(self, cfg: DictConfig) -> object:
        try:
            return self.task(cfg)
        except BaseException as e:  # noqa: BLE001 - re-raised by reraise(), Ctrl-C included
            self.error = e
            return None

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error
