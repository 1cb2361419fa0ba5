"""Under DDP every rank takes the same recovery decision: a kernel that fails to compile on
one rank alone makes every rank retake the step with the same choice, so the ranks keep training the
same kernels and the same parameters (posenc/train/recovery.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, warm_bin

pytestmark = pytest.mark.slow  # two ranks under torchrun


def test_one_ranks_failed_compilation_makes_every_rank_step_down_together(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("ddp_recovery_worker.py")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "--no-python", str(warm_bin() / "python-script"), str(worker), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=cli_env())
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["step"] == 2 and rank["compiled"]  # two steps, the rest of the model still compiled
        [fallback] = rank["kernels"]["fallbacks"]  # rank 0 compiled FlexAttention, yet stepped down with rank 1
        assert (fallback["layer_kind"], fallback["left"], fallback["took"], fallback["step"]) == \
            ("global", "flex", "dense", 1)
        assert rank["kernels"]["layer_kinds"]["global"]["path"] == "dense"
    assert ranks[0]["kernels"] == ranks[1]["kernels"]
    assert ranks[0]["params"] == ranks[1]["params"]  # the same averaged gradients: the same parameters
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank its own rows
