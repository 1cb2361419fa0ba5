"""A run stopped by SIGTERM after a checkpoint and resumed reaches the same losses, step for
step, as the run that was never interrupted (CPU, deterministic). The run dir is the source of
truth: a resume restores the run's own overrides, refuses to change the experiment, and a
refused or no-op resume leaves the run dir as it was."""

from __future__ import annotations

import shlex
import shutil
import signal
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY, interrupt_training, run_cli, run_dirs

from posenc.record.directory import read_jsonl
from posenc.record.rundir import load_checkpoint

RUN = [*TINY, "trainer.max_steps=40", "trainer.checkpoint_interval=5", "trainer.eval_interval=20"]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in read_jsonl(run_dir / "metrics.jsonl")]


def test_sigterm_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    returncode, stderr = interrupt_training(RUN, interrupted, signal.SIGTERM)
    assert returncode == 128 + signal.SIGTERM  # the shell's convention (130 after Ctrl-C)
    assert "stopped by SIGTERM" in stderr.strip().splitlines()[-1]
    assert "Error executing job" not in stderr  # Hydra's line for a failed job: the stop is posenc's to say
    [run_dir] = run_dirs(interrupted)
    stopped_at = len(losses(run_dir))
    assert stopped_at < 40, "the run finished before SIGTERM arrived"
    log = (run_dir / "train.log").read_text()
    assert log.splitlines()[0].endswith(f"run dir: {run_dir.resolve()}")  # named at the start, not only at the end
    assert "interrupted: stopped by SIGTERM at step" in log  # train.log says why it ends there

    # the printed command, verbatim: the run's own overrides come from its run dir
    printed = stderr.strip().splitlines()[-1].split("`")[1]
    assert shlex.split(printed)[:2] == ["posenc", "train"]
    resumed = run_cli(*shlex.split(printed)[1:], cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert run_dirs(interrupted) == [run_dir]  # continued in the same directory
    assert "resumed at step" in (run_dir / "train.log").read_text()

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
    state = load_checkpoint(run_dir)
    assert state["step"] == 1  # the diverged step never replaced the good checkpoint
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step TINY rope run (model.d_model=32, not model=tiny's default)."""
    cwd = tmp_path_factory.mktemp("finished")
    result = run_cli("train", *TINY, cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(cwd)
    return run_dir


@pytest.fixture
def run_dir(finished_run: Path, tmp_path: Path) -> Path:
    """A copy of the finished run, for a test to resume."""
    return Path(shutil.copytree(finished_run, tmp_path / "outputs" / "run"))


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_extending_a_run_with_only_its_dir_keeps_its_own_overrides(run_dir: Path) -> None:
    before = losses(run_dir)
    result = run_cli("train", f"trainer.resume={run_dir}", "trainer.max_steps=6", cwd=run_dir.parent.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert config["model"]["d_model"] == 32 and config["trainer"]["seq_len"] == 32  # TINY's, not the defaults
    assert config["trainer"]["max_steps"] == 6
    assert losses(run_dir)[:4] == before  # the first 4 steps are kept, not retrained
    assert [s for s, _ in losses(run_dir)] == list(range(1, 7))  # then it continues: 5, 6, each once
    # and the extended run is again resumable from its dir alone: it is now complete at 6
    again = run_cli("train", f"trainer.resume={run_dir}", cwd=run_dir.parent.parent)
    assert again.returncode == 0 and "trainer.max_steps=" in again.stdout


def test_a_resume_that_changes_the_experiment_is_refused_and_writes_nothing(run_dir: Path) -> None:
    before = snapshot(run_dir)
    result = run_cli("train", f"trainer.resume={run_dir}", "encoding=nope", "trainer.max_steps=6",
                     cwd=run_dir.parent.parent)
    assert result.returncode != 0
    after = snapshot(run_dir)
    assert after[".hydra/config.yaml"] == before[".hydra/config.yaml"]
    assert after["summary.json"] == before["summary.json"]
    assert after == before
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "encoding=nope" in lines[0]
    assert "max_steps=6" not in lines[0].split("—")[0]  # an allowed change is not named as the problem


def test_resuming_a_finished_run_says_so_and_touches_nothing(run_dir: Path) -> None:
    before = snapshot(run_dir)
    mtimes = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    result = run_cli("train", f"trainer.resume={run_dir}", cwd=run_dir.parent.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout.strip().splitlines()
    assert len(out) == 1 and "complete" in out[0] and "trainer.max_steps=" in out[0]
    assert snapshot(run_dir) == before
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == mtimes


def test_ctrl_c_exits_130_and_prints_the_resume_command(tmp_path: Path) -> None:
    """The first Ctrl-C finishes the step, saves and exits as shells expect of SIGINT (128 + 2)."""
    returncode, stderr = interrupt_training(RUN, tmp_path, signal.SIGINT)
    last = stderr.strip().splitlines()[-1]
    assert returncode == 130, stderr[-2000:]
    assert last.startswith("interrupted: stopped by SIGINT") and "trainer.resume=" in last  # asked for: no error
