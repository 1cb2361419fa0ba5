"""The Hydra entry point behind `posenc train`: one call of run_job per job."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from posenc.train import distributed
from posenc.config import CONFIG_PATH
from posenc.cli.explain import explain
from posenc.rundir import SUMMARY_FILE, has_results, record_sweep, remove_run_dir, write_json_atomic

log = logging.getLogger("posenc")

#: one line per failed job of the current multirun, for the CLI's closing message
FAILED_JOBS: list[str] = []
#: a single run's exception, re-raised after Hydra returns (so Hydra prints nothing of its own)
_RUN_ERROR: list[BaseException] = []


def run_job(cfg: DictConfig) -> float | None:
    """Train one job. A single run re-raises (the CLI prints one line); a sweep job records
    its failure in summary.json and returns, so one bad job never stops the others."""
    from posenc.report.console import print_summary
    from posenc.train.loop import train

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun:
        record_sweep(Path(hc.sweep.dir))
    try:
        summary = train(cfg, run_dir)
    except BaseException as e:
        if not multirun or isinstance(e, KeyboardInterrupt):
            if not has_results(run_dir) and not cfg.trainer.get("resume") and distributed.is_main():
                remove_run_dir(run_dir)  # nothing worth keeping: leave no half-written run
            if isinstance(e, Exception):
                _RUN_ERROR.append(e)
                return None
            raise
        message = explain(e)
        log.error("job %s failed: %s", hc.job.num, message)
        write_json_atomic(run_dir / SUMMARY_FILE, {"status": "failed", "error": message,
                                                       "overrides": list(hc.overrides.task)})
        FAILED_JOBS.append(f"job {hc.job.num} ({' '.join(hc.overrides.task)}): {message}")
        return None
    if distributed.is_main():
        print_summary(summary, run_dir)
    return summary.get("val/loss")


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


def hydra_train(args: list[str]) -> None:
    """Run Hydra on args exactly as if they followed a @hydra.main script on the command line."""
    FAILED_JOBS.clear()
    _RUN_ERROR.clear()
    argv = sys.argv
    sys.argv = ["posenc", *args]
    try:
        _hydra_main()
    finally:
        sys.argv = argv
    if _RUN_ERROR:
        raise _RUN_ERROR.pop()
