"""`posenc train dataset=synthetic`, `posenc eval` and `posenc probe` end to end: task accuracy
by length in summary.json (null where the encoding has no positions), per-position loss, and
the same curves and figures in the W&B run."""

import json

import pytest
from conftest import TINY, run_cli, run_dirs

from posenc.record import metrics as M

TASK = ["dataset=synthetic", "dataset.task=flip_flop", "dataset.eval_instances=8", "dataset.eval_multiples=[1,2]",
        "eval.at_end=true"]


def wandb_files(run_dir, kind):
    return [p for p in (run_dir / "wandb").glob(f"offline-run-*/files/media/{kind}/**/*") if p.is_file()]


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("tasks")
    result = run_cli("train", *TINY, *TASK, "encoding=learned", "logger=wandb", cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    (run_dir,) = run_dirs(cwd)
    return cwd, run_dir


def test_task_accuracy_by_length_lands_in_summary_with_null_beyond_max_len(learned_run):
    _, run_dir = learned_run
    summary = json.loads((run_dir / "summary.json").read_text())
    # exact match over the 8 evaluation instances, with its 95% Wilson interval as scipy computes it
    correct = summary["tasks/flip_flop/accuracy@32"] * 8
    assert correct == round(correct)
    stats = pytest.importorskip("scipy.stats")
    wilson = stats.binomtest(round(correct), 8).proportion_ci(0.95, method="wilson")
    assert (summary["tasks/flip_flop/low@32"], summary["tasks/flip_flop/high@32"]) == \
        pytest.approx((wilson.low, wilson.high), abs=1e-9)
    # learned has no position 32: not applicable, said so, and the run did not fail
    assert summary["tasks/flip_flop/accuracy@64"] is None
    assert "max_len" in summary["tasks"]["lengths"][1]["skipped"]
    assert "extrapolation/ppl@32" not in summary  # perplexity over task instances is not evaluated
    declared = M.lookup("tasks/flip_flop/accuracy@64")
    assert declared is not None and declared.better == "higher"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "val/loss" in rows[1] and "tasks/flip_flop/accuracy@32" in rows[-1]


def test_per_position_loss_and_wandb_charts(learned_run):
    _, run_dir = learned_run
    record = json.loads((run_dir / "per_position.json").read_text())
    assert record["train_length"] == 32 and [r["length"] for r in record["lengths"]] == [32, 64]
    assert record["lengths"][1]["loss"] is None  # learned: nothing beyond max_len
    assert (run_dir / "per_position.png").stat().st_size > 1000
    tables = [p.name.split("_table_")[0] for p in wandb_files(run_dir, "table")]  # W&B's <key>_table_<n>_<hash>
    assert sorted(tables) == ["accuracy_by_length", "loss"]  # tasks/flip_flop/accuracy_by_length, per_position/loss: once each
    assert any("per_position" in str(p) for p in wandb_files(run_dir, "images"))


def test_posenc_eval_and_probe_on_a_task_run(learned_run):
    cwd, run_dir = learned_run
    result = run_cli("eval", str(run_dir), cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "accuracy" in result.stdout and "flip_flop" in result.stdout
    record = json.loads((run_dir / "eval.json").read_text())
    assert record["tasks/flip_flop/accuracy@32"] == json.loads((run_dir / "summary.json").read_text())[
        "tasks/flip_flop/accuracy@32"]  # the same instances, the same model
    # the run's own settings and checkpoint: training's per_position.png is this evaluation's, not copied beside it
    assert not (run_dir / "per_position_eval.json").exists() and "already holds it" in result.stdout
    assert [p.name for p in run_dir.glob("eval*.json")] == ["eval.json"]  # eval_<overrides>.json globs stay unambiguous
    result = run_cli("eval", str(run_dir), "dataset.eval_instances=64", cwd=cwd)  # other settings: its own files
    assert result.returncode == 0, result.stderr[-2000:]
    assert (run_dir / "per_position_eval_eval_instances-64.json").exists()
    result = run_cli("probe", str(run_dir), cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (run_dir / "probes" / "probes.json").exists()
    assert any("probes" in str(p) for p in wandb_files(run_dir, "images"))  # resumed W&B run got the figures


def test_a_corpus_run_writes_per_position_loss_at_every_eval_length(workdir):
    result = run_cli("train", *TINY, "eval.at_end=true", "eval.lengths=[1,4]", "eval.tokens=512", "logger=wandb",
                     cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    (run_dir,) = run_dirs(workdir)
    record = json.loads((run_dir / "per_position.json").read_text())
    assert [r["length"] for r in record["lengths"]] == [32, 128]
    assert record["lengths"][1]["end"][-1] == 128 and sum(record["lengths"][1]["count"]) == 512
    assert record["lengths"][1]["start"][: len(record["lengths"][0]["start"])] == record["lengths"][0]["start"]
    tables = [p.name.split("_table_")[0] for p in wandb_files(run_dir, "table")]  # W&B's <key>_table_<n>_<hash>
    assert sorted(tables) == ["loss", "ppl_by_length"]  # extrapolation/ppl_by_length, per_position/loss: once each


def test_logger_none_writes_no_wandb_dir_and_the_same_files(workdir):
    result = run_cli("train", *TINY, *TASK, "encoding=nope", cwd=workdir)  # TINY: logger=none
    assert result.returncode == 0, result.stderr[-2000:]
    (run_dir,) = run_dirs(workdir)
    assert not (run_dir / "wandb").exists()
    assert (run_dir / "per_position.png").exists()
    assert json.loads((run_dir / "summary.json").read_text())["tasks/flip_flop/accuracy@64"] is not None


def test_a_tokenizer_other_than_bytes_is_refused_on_a_task(workdir):
    result = run_cli("train", *TINY, *TASK, "tokenizer=bpe", cwd=workdir)
    assert result.returncode != 0 and "error: " in result.stderr and "tokenizer=byte" in result.stderr
    assert not run_dirs(workdir) or not list(workdir.rglob("summary.json"))
