"""How `posenc train` enters Hydra: the task function (one job) and the call that runs it.

Results travel as return values. The task returns the run's summary (a sweep job that fails
returns ``{"status": "failed", "error": ...}`` instead, so the other jobs still run); Hydra
wraps each in a JobReturn, and ``run_hydra`` returns them all, including those of jobs that
a launcher ran in other processes (submitit pickles each JobReturn back). A single run's
exception is re-raised by Hydra itself (``JobReturn.return_value``) and reaches the CLI.

Why Hydra's ``Hydra`` class rather than ``@hydra.main``: ``@hydra.main`` reads ``sys.argv``,
discards the task's return value, and prints (then ``sys.exit(1)``s) any exception unless the
``HYDRA_FULL_ERROR`` environment variable is set. Hydra has no public API that runs an app on
a given argv and hands back its results, so run_hydra does what ``hydra._internal.utils.
_run_hydra`` does (parse argv with Hydra's own parser, build the search path, dispatch
--help/--cfg/--info/-m) on ``hydra._internal.hydra.Hydra``, whose run/multirun return the
JobReturns. It is private API, pinned by pyproject (hydra-core 1.3.x); tests/test_train_cli.py
and tests/test_launcher.py exercise every path it takes.

A sweep (-m) runs through posenc/cli/sweep.py (one Ctrl-C stops it whole; it resumes in place; a
refused one writes nothing). It is named before Hydra starts it (sweep_naming: its directory from the experiment,
``name=``, or the swept keys; each job's from its swept values, through Hydra's own
override_dirname.exclude_keys; posenc/cli/sweep_names.py), and its end prints where it went and the
`posenc compare` command for it (print_next_step, posenc/cli/job_returns.py).
"""

from __future__ import annotations

import argparse
import functools
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.types import RunMode
from omegaconf import DictConfig

from posenc.cli.explain import explain
from posenc.cli.job_returns import job_returns, print_next_step
from posenc.cli.sweep import SweepStopped, prepare_job, run_sweep
from posenc.cli.sweep_names import sweep_naming, swept_keys
from posenc.config import apply_choice_schemas
from posenc.errors import UserError
from posenc.run.directory import SUMMARY_FILE, has_results, record_sweep, remove_run_dir, write_json_atomic
from posenc.config.searchpath import add_config_dirs, config_search_path, warn_shadowed
from posenc.train import distributed

log = logging.getLogger("posenc")
CONFIG_NAME = "config"


def run_job(cfg: DictConfig, checked: bool = False) -> dict:
    """Train one job; return its summary. A single run re-raises (the CLI prints one line); a
    sweep job records its failure in summary.json and returns it, so one bad job never stops
    the others. checked: run_hydra's check already saw this very config (a single run), so
    training does not validate it again; a sweep's jobs each differ from the config checked."""
    from posenc.report.console import print_summary
    from posenc.train.checkpoint import RunInterrupted
    from posenc.train.loop import train

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    warn_shadowed(hc.runtime.choices)  # a sweep job's own choices (said once per process)
    if multirun:
        record_sweep(Path(hc.sweep.dir))
        kept = prepare_job(cfg, run_dir)  # a resumed sweep: a completed job is kept, an interrupted one continues
        if kept is not None:
            return kept
    try:
        summary = train(apply_choice_schemas(cfg), run_dir, checked=checked)
    except BaseException as e:
        if multirun and isinstance(e, RunInterrupted):  # its checkpoint is saved: the whole sweep stops
            raise SweepStopped(e.exit_code - 128) from e
        if not multirun or not isinstance(e, Exception):
            if not has_results(run_dir) and not cfg.trainer.get("resume") and distributed.is_main():
                remove_run_dir(run_dir)  # nothing worth keeping: leave no half-written run
            raise
        failure = {"status": "failed", "error": explain(e), "overrides": list(hc.overrides.task)}
        log.error("job %s failed: %s", hc.job.num, failure["error"])
        write_json_atomic(run_dir / SUMMARY_FILE, failure)
        return failure
    if distributed.is_main():
        print_summary(summary, run_dir)
        print_checkpoint(summary.get("checkpoint") or {})
    return summary


def print_checkpoint(kept: dict) -> None:
    """The end-of-run line on what trainer.checkpoint kept, and its size."""
    from posenc.cli.common import console

    if kept.get("kind") == "none" or not kept.get("paths"):
        line = "checkpoint: none kept (trainer.checkpoint=none: this run cannot be resumed or evaluated later)"
    else:
        line = f"checkpoint ({kept['kind']}): {', '.join(kept['paths'])}, {kept['mb']:.1f} MB"
    console.print(line, highlight=False, soft_wrap=True)


def hydra_parser() -> argparse.ArgumentParser:
    """Hydra's own command-line parser; a flag it does not know is a UserError, not argparse's
    usage text and exit 2."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog = "posenc train"

    def refuse(message: str) -> None:
        raise UserError(f"{message} — see `posenc train --help`")

    parser.error = refuse  # type: ignore[method-assign]
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """argv as Hydra reads it: its flags apart, the overrides in .overrides (`-m` may come
    after the overrides, as users type it)."""
    return hydra_parser().parse_intermixed_args(argv)


def run_hydra(args: argparse.Namespace, check: Callable[[DictConfig, bool], None],
              task: Callable[..., object] = run_job) -> list[JobReturn]:
    """Run Hydra as `python app.py ARGS` would, with conf/ as the primary config; return every
    job's JobReturn (none for --help, --cfg, --info). check(cfg, single) sees the composed config of a
    run (or of a sweep's common part) before Hydra creates any directory; a single run is
    composed once, and its task is told (checked=True) that check saw its config."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    if args.experimental_rerun is not None:
        raise UserError("--experimental-rerun is not supported by posenc — rerun with the run's overrides")
    if sum([bool(args.run), args.cfg is not None, bool(args.multirun), bool(args.shell_completion),
            args.info is not None]) > 1:
        raise UserError("only one of --run, --multirun, --cfg, --info and --shell-completion can be given")
    config_name = args.config_name or CONFIG_NAME
    if args.config_dir is not None:  # the plugin search path every command has (posenc/config/searchpath.py)
        add_config_dirs([args.config_dir])
    search_path = config_search_path(args.config_path)
    # our launcher presets extend the plugin's schema of the same name, which Hydra 1.3 still merges
    warnings.filterwarnings("ignore", message=r"(?s).*ConfigStore schema with the same name")
    hydra = Hydra.create_main_hydra2(task_name="posenc", config_search_path=search_path)
    overrides = list(args.overrides)
    try:
        if args.help:
            hydra.app_help(config_name=config_name, args_parser=hydra_parser(), args=args)
            return []
        if args.hydra_help:
            hydra.hydra_help(config_name=config_name, args_parser=hydra_parser(), args=args)
            return []
        if args.cfg is not None:
            hydra.show_cfg(config_name=config_name, overrides=overrides, cfg_type=args.cfg,
                           package=args.package, resolve=args.resolve)
            return []
        if args.info is not None:
            hydra.show_info(args.info, config_name=config_name, overrides=overrides)
            return []
        if args.shell_completion:
            hydra.shell_completion(config_name=config_name, overrides=overrides)
            return []
        mode, cfg = compose_once(hydra, config_name, overrides, bool(args.multirun))
        warn_shadowed(cfg.hydra.runtime.choices)  # a chosen file that another source also holds
        check(cfg, mode == RunMode.RUN)
        if mode == RunMode.RUN:
            return [run_composed(hydra, cfg, config_name, functools.partial(task, checked=True))]
        swept = swept_keys(args.overrides, cfg)
        overrides += sweep_naming(args.overrides, swept, cfg)
        returns = job_returns(run_sweep(hydra, config_name, overrides, task))  # Hydra.multirun, stopped whole by a signal
        print_next_step(returns, swept)
        return returns
    finally:
        GlobalHydra.instance().clear()


def compose_once(hydra, config_name: str, overrides: list[str], multirun: bool) -> tuple[RunMode, DictConfig]:
    """The run mode and the composed config (overrides gains hydra.mode where -m or the default
    decides it). A config may set hydra.mode itself (an experiment that is always a sweep):
    without -m a run is composed once as a run and becomes a sweep only if its config says so
    (Hydra's get_mode would compose it a second time just to read that)."""
    def compose(mode: RunMode) -> DictConfig:
        return hydra.compose_config(config_name=config_name, overrides=overrides, run_mode=mode,
                                    with_log_configuration=False)

    if multirun:
        overrides.append(f"hydra.mode={RunMode.MULTIRUN.name}")
        return RunMode.MULTIRUN, compose(RunMode.MULTIRUN)
    try:
        cfg = compose(RunMode.RUN)
    except Exception:  # a sweep override (a,b) without -m: an error unless the config is always a sweep
        if hydra.get_mode(config_name=config_name, overrides=overrides) != RunMode.MULTIRUN:
            raise
        return RunMode.MULTIRUN, compose(RunMode.MULTIRUN)
    if cfg.hydra.mode == RunMode.MULTIRUN:
        return RunMode.MULTIRUN, compose(RunMode.MULTIRUN)
    overrides.append(f"hydra.mode={RunMode.RUN.name}")
    cfg.hydra.mode = RunMode.RUN  # as the override would have set it, and as Hydra.run does
    return RunMode.RUN, cfg


def run_composed(hydra, cfg: DictConfig, config_name: str, task: Callable[[DictConfig], object]) -> JobReturn:
    """Hydra.run on a config already composed (Hydra 1.3's run composes it again): the same
    logging, callbacks and run_job, and a failed job's exception raised as it is (HeldError)."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import configure_log, run_job as hydra_run_job
    from hydra.types import HydraContext

    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)  # compose_config(with_log_configuration=True)'s
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    held = HeldError(task)
    returned = hydra_run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                             task_function=held, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                             configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=returned)
    held.reraise()
    return returned


class HeldError:
    """A single run's task, holding its exception until Hydra's run returns: Hydra 1.3 prints
    "Error executing job with overrides: [...]" to stderr before re-raising a failed job's
    exception (JobReturn.return_value), a second line beside posenc's one `error:` line."""

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
