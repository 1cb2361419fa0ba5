"""torchrun with 2 CPU processes (gloo): one run directory, the tokens of a global batch of
2 × trainer.batch_size per step, and the same training as one process with twice the batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, cli_env, run_cli, run_dirs


def test_torchrun_two_processes_one_run(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "posenc", "train", *TINY, "device=cpu"]
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
