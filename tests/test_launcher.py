"""A sweep through Hydra's submitit launcher (local executor): the jobs run in other processes,
and their results still come back to the CLI (Hydra's JobReturns, pickled back by submitit). With
``hydra.launcher.tasks_per_node=2`` each job is two tasks, which train as one run on two DDP ranks
(gloo), the rendezvous taken from the job's environment, as a SLURM job of two tasks does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY, run_cli, run_dirs

pytestmark = pytest.mark.slow  # sweeps through submitit's local launcher, processes of their own

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra is not installed")


def test_submitit_local_sweep_of_two_task_jobs_trains_each_on_two_ranks_and_reports_the_failed_one(
        workdir: Path) -> None:
    # linear attention has no score matrix for t5_bias's bias: that job fails when it builds, rope trains
    result = run_cli("train", "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", *TINY,
                     "trainer.max_steps=2", "model.attention=linear", "encoding=rope,t5_bias", cwd=workdir)
    summaries = {r.name.split("_", 1)[1]: json.loads((r / "summary.json").read_text()) for r in run_dirs(workdir)}
    status = {name: s["status"] for name, s in summaries.items()}
    assert status == {"encoding=rope": "completed", "encoding=t5_bias": "failed"}, result.stderr[-3000:]
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of the sweep's 2 jobs failed: job 1 (") and "encoding=t5_bias" in last, last
    assert "no score matrix" in last and "Traceback" not in result.stderr

    # the two tasks of the rope job were one run: each step the global batch of both ranks
    rope = summaries["encoding=rope"]
    steps, batch, seq_len = 2, 4, 32  # trainer.max_steps above; TINY's batch and length
    assert (rope["world_size"], rope["global_batch"], rope["tokens"]) == (2, 2 * batch, steps * 2 * batch * seq_len)
    [rope_dir] = [r for r in run_dirs(workdir) if r.name.endswith("encoding=rope")]
    log = (rope_dir / "train.log").read_text()
    assert log.count("run dir:") == 1 and log.count("train loss") == steps  # rank 0 alone writes the job's log

    # the jobs ran in processes of their own: their progress was read from their run dirs and printed here
    # (each job's end; its step lines come every 30 s, which a 2-step job does not last: test_sweep_progress.py)
    out = result.stdout
    assert "job 0 (encoding=rope): finished, val/ppl" in out, out[-3000:]
    assert "job 1 (encoding=t5_bias): failed" in out and "no score matrix" in out, out[-3000:]
