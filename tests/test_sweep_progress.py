"""A sweep whose jobs run elsewhere (submitit, SLURM) shows each job's step and ETA: the watcher reads
what a job writes into its run directory, as a job writes it (no launcher, no timing: the test writes
the files and polls)."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from posenc.cli.sweep_progress import EVERY_S, SweepWatcher
from posenc.record.rundir import RunDir


def job_dir(sweep: Path, name: str, max_steps: int) -> RunDir:
    run = RunDir(sweep / name)
    run.config_file.parent.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"trainer": {"max_steps": max_steps}}), run.config_file)
    return run


def log_row(run: RunDir, **row) -> None:
    with run.metrics_file.open("a") as f:
        f.write(json.dumps(row) + "\n")


def test_each_job_says_its_step_and_eta_when_it_first_logs_then_every_interval_and_when_it_ends(tmp_path: Path) -> None:
    said: list[str] = []
    run = job_dir(tmp_path, "0_base=500", max_steps=100)
    watcher = SweepWatcher(tmp_path, said.append)
    watcher.poll()
    assert said == []  # started, nothing logged yet: nothing to say

    # 10 steps in 20 s of training: 90 steps left at 2 s each
    log_row(run, step=10, elapsed_s=20.0, **{"train/loss": 2.5})
    watcher.poll()
    assert said == ["job 0 (base=500): step 10/100  train loss 2.5000  ETA 0:03:00"]

    log_row(run, step=20, elapsed_s=40.0, **{"train/loss": 2.25, "val/ppl": 9.5})
    watcher.poll()
    assert len(said) == 1  # within EVERY_S of its last line: quiet
    watcher.seen[0].printed_at -= EVERY_S + 1
    watcher.poll()
    assert said[-1] == "job 0 (base=500): step 20/100  train loss 2.2500  val ppl 9.50  ETA 0:02:40"

    run.summary_file.write_text(json.dumps({"status": "completed", "val/ppl": 9.25}))
    watcher.poll()
    watcher.poll()  # an ended job is said once
    assert said[-1] == "job 0 (base=500): finished, val/ppl 9.250" and len(said) == 3


def test_a_resumed_jobs_eta_counts_only_the_steps_taken_in_this_sweep(tmp_path: Path) -> None:
    said: list[str] = []
    run = job_dir(tmp_path, "1_base=10000", max_steps=100)
    log_row(run, step=50, elapsed_s=1000.0, **{"train/loss": 2.0})  # before the resume: a slow machine
    watcher = SweepWatcher(tmp_path, said.append)
    watcher.poll()
    assert said == []  # nothing new since the resume
    log_row(run, step=60, elapsed_s=1010.0, **{"train/loss": 1.9})  # 1 s a step now: 40 s left, not 800
    watcher.poll()
    assert said == ["job 1 (base=10000): step 60/100  train loss 1.9000  ETA 0:00:40"]


def test_a_failed_job_says_why_and_a_kept_one_says_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    kept = job_dir(tmp_path, "0_encoding=rope", max_steps=10)
    kept.summary_file.write_text(json.dumps({"status": "completed", "val/ppl": 3.0}))
    failed = job_dir(tmp_path, "1_encoding=t5_bias", max_steps=10)
    watcher = SweepWatcher(tmp_path, said.append)  # a resumed sweep: job 0 was already complete
    failed.summary_file.write_text(json.dumps({"status": "failed", "error": "no score matrix"}))
    watcher.poll()
    assert said == ["job 1 (encoding=t5_bias): failed — no score matrix"]
