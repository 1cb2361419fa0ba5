"""torchrun with 2 CPU processes (gloo): one run directory, the tokens of a global batch of
2 × trainer.batch_size per step, and the same training as one process with twice the batch;
with gradient accumulation, one all-reduce per optimizer step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY, cli_env, run_cli, run_dirs, warm_bin


def test_torchrun_two_processes_one_run(tmp_path: Path) -> None:
    # each rank a process of its own, torchrun's environment and all: `--no-python` runs the warm
    # posenc client (tests/warm_posenc.py) as the rank's command instead of a new `python -m posenc`
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--no-python",
           str(warm_bin() / "posenc"), "train", *TINY, "device=cpu"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert result.returncode == 0, result.stderr[-3000:]
    [run_dir] = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps, batch, seq_len = 4, 4, 32  # from TINY
    assert summary["tokens"] == steps * 2 * batch * seq_len
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # rank 0 alone logs

    # one process with the global batch: the same windows, the same averaged gradients
    (tmp_path / "single").mkdir()
    single = run_cli("train", *TINY, "device=cpu", f"trainer.batch_size={2 * batch}", cwd=tmp_path / "single")
    assert single.returncode == 0, single.stderr[-3000:]
    [single_dir] = run_dirs(tmp_path / "single")
    single_rows = [json.loads(line) for line in (single_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [r["tokens"] for r in single_rows]
    for ddp_row, one_row in zip(rows, single_rows):
        assert ddp_row["train/loss"] == pytest.approx(one_row["train/loss"], rel=1e-4)


def test_accumulation_all_reduces_once_per_optimizer_step_and_trains_as_one_process(tmp_path: Path) -> None:
    """grad_accum=4 under DDP: every bucket of gradients is all-reduced once per optimizer step,
    in the backward of its last micro-batch (no_sync before it), not once per micro-batch. What is
    counted: calls of a DDP communication hook that wraps the default all-reduce; DDP calls it once
    per gradient bucket per synchronised backward (this 1-layer model fits one bucket). And the
    result is one process's with the same global batch: the same losses and parameters."""
    worker = Path(__file__).with_name("ddp_accumulation_worker.py")
    steps, grad_accum, global_batch = 3, 4, 8
    args = [str(steps), str(grad_accum), str(global_batch)]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "--no-python", str(warm_bin() / "python-script"), str(worker), str(tmp_path / "ddp"), *args],
                         capture_output=True, text=True, timeout=300, env=cli_env())
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    from ddp_accumulation_worker import main  # one process needs no launcher: in this one

    main(tmp_path / "one", steps, grad_accum, global_batch)

    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    calls = [tuple(c) for c in result["calls"]]
    buckets = sorted({bucket for _, _, bucket in calls})
    assert buckets == [0]  # one bucket: one all-reduce per optimizer step
    assert calls == [(step, grad_accum - 1, 0) for step in range(steps)]  # in the last micro-batch only

    single = json.loads((tmp_path / "one" / "result.json").read_text())
    assert single["calls"] == []  # one process: no DDP, nothing to reduce
    assert result["losses"] == pytest.approx(single["losses"], rel=1e-5)
    theirs, ours = load_file(tmp_path / "one" / "params.safetensors"), load_file(tmp_path / "ddp" / "params.safetensors")
    assert theirs.keys() == ours.keys()
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6, msg=name)
