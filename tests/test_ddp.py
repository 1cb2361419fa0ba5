"""torchrun with 2 CPU processes (gloo): one run directory, and the tokens of a global batch
of 2 × trainer.batch_size per step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import TINY, cli_env, run_dirs


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
