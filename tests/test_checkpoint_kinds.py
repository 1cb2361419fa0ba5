"""trainer.checkpoint=last|best|none: what a run keeps, what the summary says about it, and
what resume and `posenc eval` do with it."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import pytest
from conftest import TINY, interrupt_training, run_cli, run_dirs

from posenc.cli.launch import prepare
from posenc.config import compose, validate
from posenc.errors import UserError
from posenc.eval.run import load_trained
from posenc.record.directory import read_jsonl
from posenc.record.rundir import load_checkpoint


def test_last_keeps_the_last_checkpoint_and_the_summary_records_its_size(workdir: Path) -> None:
    result = run_cli("train", *TINY, cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(workdir)
    kept = json.loads((run_dir / "summary.json").read_text())["checkpoint"]
    size = (run_dir / "checkpoints" / "last.safetensors").stat().st_size
    assert kept == {"kind": "last", "paths": ["checkpoints/last.safetensors"], "bytes": size, "mb": round(size / 2**20, 2)}
    assert f"checkpoint (last): checkpoints/last.safetensors, {size / 2**20:.1f} MB" in result.stdout


def test_none_keeps_nothing_and_eval_and_resume_say_so_in_one_line(workdir: Path) -> None:
    result = run_cli("train", *TINY, "trainer.checkpoint=none", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(workdir)
    assert not (run_dir / "checkpoints").exists()
    assert json.loads((run_dir / "summary.json").read_text())["checkpoint"]["kind"] == "none"
    assert "checkpoint: none kept" in result.stdout

    # `posenc eval` and resume: one line each, saying the run kept no checkpoint
    with pytest.raises(UserError, match=r"kept no checkpoint \(it ran with trainer.checkpoint=none\) — train it again"):
        load_trained(run_dir, [])
    with pytest.raises(UserError, match=r"^trainer.resume: .* trainer.checkpoint=none and kept no checkpoint; start"):
        prepare([f"trainer.resume={run_dir}", "trainer.max_steps=8"], cwd=workdir)

def test_best_keeps_the_lowest_val_loss_resumes_from_last_and_drops_last_at_the_end(workdir: Path) -> None:
    run = [*TINY, "trainer.max_steps=30", "trainer.checkpoint_interval=5", "trainer.eval_interval=5",
           "trainer.checkpoint=best"]
    _, stderr = interrupt_training(run, workdir, signal.SIGTERM)
    [run_dir] = run_dirs(workdir)
    assert "stopped by SIGTERM" in stderr, stderr[-2000:]
    # unfinished: the last checkpoint is kept for the resume, the best beside it
    assert (run_dir / "checkpoints" / "last.safetensors").is_file() and (run_dir / "checkpoints" / "best.safetensors").is_file()

    printed = stderr.strip().splitlines()[-1].split("`")[1]
    resumed = run_cli(*shlex.split(printed)[1:], cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r] == list(range(1, 31))

    # completed: the best alone, holding the evaluation with the lowest val/loss
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.safetensors"]
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "val/loss" in r]
    best = min(evals, key=lambda r: r["val/loss"])
    state = load_checkpoint(run_dir / "checkpoints" / "best.safetensors")
    assert state["step"] == best["step"] and state["val"]["val/loss"] == best["val/loss"]
    assert json.loads((run_dir / "summary.json").read_text())["checkpoint"]["paths"] == ["checkpoints/best.safetensors"]
    assert load_checkpoint(run_dir)["step"] == best["step"]  # `posenc eval` reads the best


def test_an_unknown_checkpoint_kind_is_refused() -> None:
    with pytest.raises(UserError, match="trainer.checkpoint=all is out of range: it must be last, best or none"):
        validate(compose(["trainer.checkpoint=all"], bench=False))
