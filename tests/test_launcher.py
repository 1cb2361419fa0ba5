"""A sweep through Hydra's submitit launcher (local executor): both jobs run and finish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY, run_cli, run_dirs

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra is not installed")


def test_submitit_local_sweep(workdir: Path) -> None:
    result = run_cli("train", "-m", "hydra/launcher=submitit_local", *TINY, "trainer.max_steps=2",
                     "encoding=rope,nope", cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = run_dirs(workdir)
    assert len(runs) == 2
    assert {json.loads((r / "summary.json").read_text())["status"] for r in runs} == {"completed"}
