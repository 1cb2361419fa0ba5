"""What a lab's W&B gets from a run (offline, read back from the run's own W&B log): the study's
group, recorded in the config too; each chart's table logged once; the perplexity at each multiple
of the training length beside the one at each length in tokens; and, asked for, the checkpoint as a
model artifact."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from conftest import TINY, run_cli, run_dirs
from wandb_records import offline_run


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("lab")
    result = run_cli("train", *[a for a in TINY if not a.startswith(("logger=", "eval.at_end"))], "logger=wandb",
                     "logger.group=pe-study", "logger.log_checkpoint=true", "eval.lengths=[1,2]", cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(cwd)
    return run_dir


def test_the_study_group_is_the_run_group_and_in_its_config(lab_run: Path) -> None:
    run = offline_run(lab_run)
    assert run["group"] == "pe-study"
    assert run["config"]["logger"]["group"] == "pe-study"


def test_each_table_is_logged_once_and_perplexity_by_multiple_beside_by_tokens(lab_run: Path) -> None:
    keys = offline_run(lab_run)["history_keys"]
    tables = {k.split("/_type")[0] for k in keys if k.endswith("/_type")}  # a table row says its _type
    assert tables == {"extrapolation/ppl_by_length_table", "per_position/loss_table", "per_position/figure"}
    assert not any(k.startswith(("extrapolation/ppl_by_length/table", "per_position/loss/table")) for k in keys)
    assert {"extrapolation/ppl@32", "extrapolation/ppl@64", "extrapolation/ppl@1x", "extrapolation/ppl@2x"} <= keys
    rows = [json.loads(line) for line in (lab_run / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    assert final["extrapolation/ppl@2x"] == final["extrapolation/ppl@64"]  # the same number, two names


def test_the_checkpoint_is_logged_as_a_model_artifact(lab_run: Path) -> None:
    checkpoint = lab_run / "checkpoints" / "last.safetensors"
    md5 = base64.b64encode(hashlib.md5(checkpoint.read_bytes()).digest()).decode()
    run = offline_run(lab_run)
    [model] = [a for a in run["artifacts"] if a["type"] == "model"]
    assert model["files"]["checkpoints/last.safetensors"] == md5  # the very file the run kept
    # and what makes a folder a run dir: downloaded, `posenc eval` reads it
    assert set(model["files"]) == {"checkpoints/last.safetensors", ".hydra/config.yaml", ".hydra/overrides.yaml",
                                   ".hydra/hydra.yaml", "provenance.json"}
    summary = json.loads((lab_run / "summary.json").read_text())
    assert model["name"] == summary["checkpoint"]["wandb_artifact"] and model["name"].startswith("model-")
    assert {"last", "step-4", "latest"} <= set(model["aliases"])
