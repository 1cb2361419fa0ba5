"""A run stopped by SIGTERM after a checkpoint and resumed reaches the same losses, step for
step, as the run that was never interrupted (CPU, deterministic)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import torch
from pathlib import Path

from conftest import TINY, cli_env, run_cli, run_dirs
from posenc.rundir import read_jsonl

RUN = [*TINY, "trainer.max_steps=40", "trainer.checkpoint_interval=5", "trainer.eval_interval=20"]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in read_jsonl(run_dir / "metrics.jsonl")]


def test_sigterm_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "posenc", "train", *RUN], cwd=interrupted, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(interrupted.glob("outputs/*/*/checkpoints/last.pt")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "stopped by SIGTERM" in stderr.strip().splitlines()[-1]
    [run_dir] = run_dirs(interrupted)
    stopped_at = len(losses(run_dir))
    assert stopped_at < 40, "the run finished before SIGTERM arrived"

    resumed = run_cli("train", *RUN, f"trainer.resume={run_dir}", cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert run_dirs(interrupted) == [run_dir]  # continued in the same directory

    assert run_cli("train", *RUN, cwd=straight).returncode == 0
    [reference] = run_dirs(straight)
    assert losses(run_dir) == losses(reference)  # every step once, identical losses
    assert [s for s, _ in losses(run_dir)] == list(range(1, 41))


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(workdir: Path) -> None:
    # an absurd learning rate with no clipping: step 1 is finite, step 2's loss is NaN
    result = run_cli("train", *TINY, "trainer.max_steps=20", "trainer.checkpoint_interval=1",
                     "trainer.lr=1e12", "trainer.grad_clip=1e30", "eval.at_end=false", cwd=workdir)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and "at step 2" in last and "Traceback" not in result.stderr
    (run_dir,) = run_dirs(workdir)
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert state["step"] == 1  # the diverged step never replaced the good checkpoint
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
