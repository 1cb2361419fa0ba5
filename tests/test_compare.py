"""`posenc compare` on hand-made run directories: grouping, mean ± std, failed runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import run_cli

from posenc.errors import UserError
from posenc.record.metrics import (
    convergence_metrics,
    elapsed_before,
    loss_auc,
    val_curve,
)
from posenc.report.compare import build_comparison
from posenc.report.plots_length import extrapolation_groups, length_stats
from posenc.report.runs import find_runs


def convergence(rows: list[dict], target: float) -> dict:
    """The convergence entries of a summary, computed with numpy rather than posenc.record.metrics (the
    code under test): the token-weighted mean val/loss (np.trapezoid over tokens / the span), and
    where a decreasing curve reaches target (np.interp between the evaluations around it)."""
    tokens = np.array([r["tokens"] for r in rows], dtype=float)
    losses = np.array([r["val/loss"] for r in rows])
    seconds = np.array([r["elapsed_s"] for r in rows])
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 calls it trapz
    span = tokens[-1] - tokens[0]  # one evaluation has no span: its loss is the mean
    out = {"convergence/val_loss_auc": float(trapezoid(losses, tokens) / span) if span else float(losses[0])}
    reached = losses.min() <= target and bool(np.all(np.diff(losses) <= 0))
    key = f"{target:g}"
    out[f"convergence/tokens_to_loss@{key}"] = round(float(np.interp(target, losses[::-1], tokens[::-1]))) \
        if reached else None
    out[f"convergence/seconds_to_loss@{key}"] = float(np.interp(target, losses[::-1], seconds[::-1])) \
        if reached else None
    return out


def make_run(root: Path, name: str, encoding: dict, seed: int, overrides: list[str], val_losses: list[float] | None,
             status: str | None = "completed", extra: dict | None = None, config: dict | None = None) -> Path:
    """A run directory as posenc writes it: .hydra/, metrics.jsonl, summary.json. val/bpb is
    val/loss / ln 2 / 4 (4 bytes per token); config entries are merged into the composed config."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    composed = {"seed": seed, "encoding": encoding, "trainer": {"seq_len": 32}, **(config or {})}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(composed))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    rows = [{"step": 10 * (i + 1), "tokens": 1000 * (i + 1), "val/loss": v, "val/bpb": v / math.log(2) / 4,
             "elapsed_s": float(i + 1)} for i, v in enumerate(val_losses or [])]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if status == "completed":
        summary = {"status": "completed", "val/loss": rows[-1]["val/loss"], "tokens_per_s": 1000.0,
                   **convergence(rows, 2.5), **(extra or {})}
        (run / "summary.json").write_text(json.dumps(summary))
    elif status == "failed":
        (run / "summary.json").write_text(json.dumps({"status": "failed", "error": "loss is nan at step 30"}))
    return run


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """rope: 3 seeds finishing at 2.0, 2.2, 2.4; learned: 2 seeds at 3.0 and 3.2, one seed that
    died (failed) and one still running (no summary) — both with tempting low losses."""
    root = tmp_path / "sweep"
    rope, learned = {"name": "rope", "base": 10000}, {"name": "learned", "max_len": 32}
    for seed, final in enumerate([2.0, 2.2, 2.4]):
        make_run(root, f"{seed}_rope", rope, seed, ["encoding=rope", f"seed={seed}"], [3.0, 2.6, final])
    for seed, final in enumerate([3.0, 3.2]):
        make_run(root, f"{3 + seed}_learned", learned, seed, ["encoding=learned", f"seed={seed}"], [3.5, 3.2, final])
    make_run(root, "5_learned", learned, 2, ["encoding=learned", "seed=2"], [3.5, 0.1], status="failed")
    make_run(root, "6_learned", learned, 3, ["encoding=learned", "seed=3"], [3.5, 0.1], status=None)
    return root


def test_seeds_are_aggregated_as_mean_and_sample_std(sweep: Path):
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss")
    assert c.by == ["encoding"]  # seed varies too, but seeds are what gets averaged
    assert [g.label for g in c.groups] == ["learned", "rope"]
    rope = c.cells[("rope", "val/loss")]
    assert rope.mean == pytest.approx(2.2) and rope.std == pytest.approx(statistics.stdev([2.0, 2.2, 2.4]))
    assert rope.std == pytest.approx(0.2)
    learned = c.cells[("learned", "val/loss")]
    assert learned.n == 2 and learned.mean == pytest.approx(3.1)  # the dead runs' 0.1 is not in it
    assert c.leaders["val/loss"].best == "rope"  # 0.9 apart, far outside Welch's interval


def test_dead_and_unfinished_runs_are_listed_not_averaged(sweep: Path, tmp_path: Path):
    result = run_cli("compare", str(sweep), "--metric", "val/loss", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "5_learned: failed — loss is nan at step 30" in result.stdout
    assert "6_learned: unfinished" in result.stdout
    report = (sweep / "report.md").read_text()
    assert "| learned | 2 (0,1; +1 failed, +1 unfinished) |" in report
    # mean [95% t-interval]: 2.2 ± t(0.975, 2)·0.2/√3 = 2.2 ± 0.4968
    assert "3.1000 [1.8294, 4.3706]" in report and "**2.2000 [1.7032, 2.6968]**" in report
    assert "5_learned: failed" in report and "6_learned: unfinished" in report
    html = (sweep / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3  # self-contained: no file links
    for png in ("convergence.png", "final_val_loss.png", "tokens_to_loss.png"):
        assert (sweep / png).read_bytes()[:4] == b"\x89PNG"


def test_by_groups_on_a_config_key_the_runs_did_not_override(sweep: Path):
    c = build_comparison(find_runs([sweep]), by=["encoding.name", "trainer.seq_len"], metric="val/loss")
    assert [g.label for g in c.groups] == ["encoding=learned, seq_len=32", "encoding=rope, seq_len=32"]


def test_a_path_that_does_not_exist_is_one_error_line(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        find_runs([tmp_path / "nope"])
    result = run_cli("compare", str(tmp_path / "nope"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error:") and "Traceback" not in result.stderr


def test_tokens_to_loss_interpolates_between_the_evaluations_that_bracket_the_target():
    rows = [{"tokens": 100, "val/loss": 3.0, "elapsed_s": 1.0}, {"tokens": 150, "train/loss": 1.0},
            {"tokens": 200, "val/loss": 2.4, "elapsed_s": 2.0}, {"tokens": 300, "val/loss": 2.6, "elapsed_s": 3.0},
            {"tokens": 400, "val/loss": 1.9, "elapsed_s": 4.0}]
    m = convergence_metrics(rows, [2.5, 2.0, 1.5, 3.5])
    # 3.0 at 100 and 2.4 at 200: the line between them crosses 2.5 at 100 + 100·0.5/0.6
    assert m["convergence/tokens_to_loss@2.5"] == round(100 + 100 * 0.5 / 0.6) == 183
    assert m["convergence/seconds_to_loss@2.5"] == pytest.approx(1 + 0.5 / 0.6)
    # the first crossing of 2.0 is between 2.6 at 300 and 1.9 at 400 (the 200-point is above 2.0)
    assert m["convergence/tokens_to_loss@2"] == round(300 + 100 * 0.6 / 0.7)
    assert m["convergence/tokens_to_loss@3.5"] == 100  # already there at the first evaluation
    assert m["convergence/tokens_to_loss@1.5"] is None  # never reached: null, not the budget


def test_loss_auc_is_the_token_weighted_mean_loss():
    flat = [{"tokens": t, "val/loss": 2.0} for t in (100, 200, 400)]
    assert loss_auc(val_curve(flat)) == pytest.approx(2.0)
    slow = [{"tokens": t, "val/loss": v} for t, v in ((100, 3.0), (200, 2.5), (400, 2.0))]
    fast = [{"tokens": t, "val/loss": v} for t, v in ((100, 3.0), (200, 2.1), (400, 2.0))]
    # same start, same end: the run that came down earlier has the smaller area
    assert loss_auc(val_curve(fast)) < loss_auc(val_curve(slow))
    # unevenly spaced evaluations: the trapezoid rule over tokens, as numpy integrates it
    assert loss_auc(val_curve(slow)) == pytest.approx(convergence([{**r, "elapsed_s": 0.0} for r in slow], 0.0)[
        "convergence/val_loss_auc"], rel=1e-12)


def test_a_resumed_run_continues_its_training_clock():
    rows = [{"step": 10, "elapsed_s": 5.0}, {"step": 20, "elapsed_s": 9.0}, {"step": 30, "elapsed_s": 14.0}]
    assert elapsed_before(rows, 20) == 9.0  # resumed from the step-20 checkpoint: 9 s already spent
    assert elapsed_before(rows, 0) == 0.0


def ppl_at(ppls: dict[int, float | None]) -> dict:
    """The summary keys train writes after an extrapolation evaluation (a null ppl: not defined)."""
    return {**{f"extrapolation/ppl@{n}": p for n, p in ppls.items()},
            "extrapolation": {"lengths": [{"length": n, "ppl": p} for n, p in ppls.items()]}}


@pytest.fixture
def length_sweep(tmp_path: Path) -> Path:
    """alibi: 2 seeds evaluated at 32/64/128; learned (max_len 64): undefined at 128; one
    failed alibi run with a tempting perplexity."""
    root = tmp_path / "lengths"
    for seed, ppl in enumerate([10.0, 12.0]):
        make_run(root, f"{seed}_alibi", {"name": "alibi"}, seed, ["encoding=alibi", f"seed={seed}"], [3.0, 2.5],
                 extra=ppl_at({32: ppl, 64: ppl - 1, 128: ppl - 2}))
    make_run(root, "2_learned", {"name": "learned", "max_len": 64}, 0, ["encoding=learned", "seed=0"], [3.0, 2.6],
             extra=ppl_at({32: 11.0, 64: 30.0, 128: None}))
    make_run(root, "3_alibi", {"name": "alibi"}, 2, ["encoding=alibi", "seed=2"], [3.0, 0.1], status="failed")
    return root


def test_extrapolation_curve_is_the_seed_mean_and_undefined_lengths_have_none(length_sweep: Path):
    alibi, learned = sorted(extrapolation_groups([length_sweep]), key=lambda g: g.label)
    assert (alibi.label, learned.label) == ("alibi", "learned")
    stats = length_stats(alibi)  # the failed seed is not in it
    assert list(stats) == [32, 64, 128] and stats[32].n == 2
    # perplexity: the geometric mean, e^(mean loss), with the loss's interval mapped back (report/stats.py)
    assert stats[32].mean == pytest.approx(math.sqrt(10.0 * 12.0)) and stats[32].low > 0
    assert stats[32].std == pytest.approx(statistics.stdev([10.0, 12.0]))
    assert length_stats(learned)[64].mean == 30.0 and length_stats(learned)[128].mean is None


def test_a_run_given_twice_counts_once_in_the_length_plot_as_in_compare(length_sweep: Path, tmp_path: Path):
    """`posenc plot extrapolation RUN SWEEP` where the sweep holds a copy of RUN: one seed, not two."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(length_sweep / "0_alibi", copy)
    alibi = next(g for g in extrapolation_groups([copy, length_sweep]) if g.label == "alibi")
    assert length_stats(alibi)[32].n == 2  # seeds 0 and 1; the copy of seed 0 is the same run


def test_compare_and_plot_extrapolation_write_the_length_figure(length_sweep: Path, tmp_path: Path):
    result = run_cli("compare", str(length_sweep), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (length_sweep / "extrapolation.png").read_bytes()[:4] == b"\x89PNG"
    assert "![extrapolation](extrapolation.png)" in (length_sweep / "report.md").read_text()
    assert (length_sweep / "report.html").read_text().count("data:image/png;base64,") == 4
    result = run_cli("plot", "extrapolation", str(length_sweep), "--out", "x.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_extrapolation_without_length_results_is_one_error_line(sweep: Path, tmp_path: Path):
    for path in (sweep, tmp_path / "nope"):
        result = run_cli("plot", "extrapolation", str(path), cwd=tmp_path)
        assert result.returncode == 1
        assert result.stderr.strip().startswith("error:") and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(UserError, match="no finished run with an extrapolation evaluation"):
        extrapolation_groups([sweep])
