"""`posenc compare` as a reviewer needs it: mistakes refused before anything is written, a
(config, seed) counted once, intervals over seeds, differences to a baseline with a verdict,
what was held fixed, and rankings within another key."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc.cli.app import app
from posenc.errors import UserError
from posenc.report.compare import build_comparison
from posenc.report.ranking import Flip
from posenc.report.runs import find_runs
from posenc.report.stats import NO_DIFFERENCE, NO_ERROR_BARS
from test_compare import make_run


def posenc(*args: str, cwd: Path):
    """`posenc ARGS` in-process (fast), in directory cwd; stdout and stderr apart."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))
    finally:
        os.chdir(old)


def written(root: Path) -> list[Path]:
    """Every file a compare could have written under root: reports and PNGs."""
    return sorted(p for p in root.rglob("*") if p.suffix in (".md", ".html", ".png"))


ROPE = [2.0, 2.2, 2.4]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """rope 3 seeds (2.0, 2.2, 2.4), alibi 3 seeds overlapping rope (2.1, 2.3, 2.5), learned 3 seeds
    far above (3.0, 3.1, 3.2), nope a single seed."""
    root = tmp_path / "sweep"
    for enc, finals in (("rope", ROPE), ("alibi", [2.1, 2.3, 2.5]), ("learned", [3.0, 3.1, 3.2]), ("nope", [2.9])):
        for seed, final in enumerate(finals):
            make_run(root, f"{enc}_{seed}", {"name": enc}, seed, [f"encoding={enc}", f"seed={seed}"], [3.5, 3.0, final],
                     config={"model": {"flavor": "llama", "n_layer": 2, "n_head": 2, "d_model": 32}})
    return root


@pytest.mark.parametrize(("option", "typo", "closest"), [("--by", "encodng", "encoding"),
                                                         ("--metric", "val/los", "val/loss"),
                                                         ("--baseline", "rpoe", "rope"),
                                                         ("--within", "model.flavour", "model.flavor")])
def test_a_mistaken_option_is_one_error_line_naming_the_valid_choices_and_writes_nothing(
        sweep: Path, tmp_path: Path, option: str, typo: str, closest: str):
    result = posenc("compare", str(sweep), option, typo, cwd=tmp_path)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and typo in lines[0], result.stderr
    choices = lines[0].split("use one of: ")[1].split(", ")
    assert choices[0] == closest  # the closest match first, then the rest
    assert written(tmp_path) == [] and not (tmp_path / "outputs").exists()


def test_the_valid_metrics_are_the_numbers_the_runs_have(sweep: Path):
    with pytest.raises(UserError) as e:
        build_comparison(find_runs([sweep]), by=None, metric="accuracy")
    listed = str(e.value).split("use one of: ")[1].split(", ")
    assert "val/loss" in listed and "convergence/val_loss_auc" in listed and "tokens_per_s" in listed
    assert "status" not in listed  # a string, not a metric


def test_a_run_repeated_with_the_same_config_and_seed_is_counted_once(sweep: Path, tmp_path: Path):
    shutil.copytree(sweep / "rope_0", sweep / "rope_0_again")  # same config, same seed: a re-run
    result = posenc("compare", str(sweep), "--metric", "val/loss", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "rope_0" in warnings[0] and "rope_0_again" in warnings[0]
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss")
    rope = next(g for g in c.groups if g.label == "rope")
    assert len(rope.completed) == 3 and rope.seeds == [0, 1, 2]
    assert "| rope | 3 (0,1,2) |" in (sweep / "report.md").read_text()


def test_of_duplicates_the_finished_run_is_kept_then_the_newest(sweep: Path):
    late = make_run(sweep, "rope_0_unfinished", {"name": "rope"}, 0, ["encoding=rope", "seed=0"], [3.5, 0.1],
                    status=None, config={"model": {"flavor": "llama", "n_layer": 2, "n_head": 2, "d_model": 32}})
    os.utime(late / "metrics.jsonl", (2e9, 2e9))  # newer, but unfinished
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss")
    assert [(kept.path.name, [d.path.name for d in dropped]) for kept, dropped in c.duplicates] == \
        [("rope_0", ["rope_0_unfinished"])]
    shutil.copytree(sweep / "rope_1", sweep / "rope_1_rerun")
    os.utime(sweep / "rope_1_rerun" / "summary.json", (2e9, 2e9))
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss")
    assert ("rope_1_rerun", ["rope_1"]) in [(k.path.name, [d.path.name for d in ds]) for k, ds in c.duplicates]


def test_every_cell_is_the_mean_with_its_95_percent_t_interval(sweep: Path):
    """Student's t interval over seeds, as scipy.stats computes it."""
    stats = pytest.importorskip("scipy.stats")
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss")
    cell = c.cells[("rope", "val/loss")]
    low, high = stats.t.interval(0.95, len(ROPE) - 1, loc=sum(ROPE) / len(ROPE), scale=stats.sem(ROPE))
    assert (cell.mean, cell.low, cell.high) == pytest.approx((2.2, low, high), rel=1e-9)
    assert c.cells[("nope", "val/loss")].low is None  # one seed: no interval


def test_baseline_gives_each_group_a_welch_difference_and_a_verdict(sweep: Path, tmp_path: Path):
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss", baseline="rope")
    learned = c.versus["learned"]
    stats = pytest.importorskip("scipy.stats")  # Welch's interval as scipy computes it
    welch = stats.ttest_ind([3.0, 3.1, 3.2], ROPE, equal_var=False).confidence_interval(0.95)
    assert (learned.difference.diff, learned.difference.low, learned.difference.high) == \
        pytest.approx((0.9, welch.low, welch.high), rel=1e-9)
    assert learned.verdict == "worse"  # higher loss, interval above 0
    assert c.versus["alibi"].verdict == NO_DIFFERENCE  # 0.1 apart with spreads of 0.2
    assert c.versus["nope"].verdict == NO_ERROR_BARS == "1 seed: no error bars"
    assert "rope" not in c.versus
    result = posenc("compare", str(sweep), "--metric", "val/loss", "--baseline", "rope", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    report = (sweep / "report_vs-rope.md").read_text()  # its own report, beside a plain compare's
    assert "val/loss against rope (lower is better" in report
    assert "| learned | 3 (0,1,2) | 3.1000 [" in report and "| worse |" in report
    assert "| nope | 1 (0) | 2.9000 | +0.7000 | 1 seed: no error bars |" in report
    assert "no detectable difference at this n" in result.stdout
    assert "2.2000 [1.7032, 2.6968]" in result.stdout  # the terminal shows the report's interval: 2.2 ± t(2)·0.2/√3


def test_a_higher_is_better_metric_reads_the_verdict_the_other_way(sweep: Path):
    c = build_comparison(find_runs([sweep]), by=None, metric="convergence/val_loss_auc", baseline="rope")
    assert c.versus["learned"].verdict == "worse"  # AUC: lower is better, as val/loss
    runs = find_runs([sweep])
    for run in runs:  # throughput: the faster group is better even though its number is larger
        run.summary["tokens_per_s"] = 2000.0 + run.summary["val/loss"] * 100 + run.seed
    c = build_comparison(runs, by=None, metric="tokens_per_s", baseline="rope")
    assert c.versus["learned"].verdict == "better"


def test_the_report_states_what_was_held_fixed_and_what_varied(sweep: Path, tmp_path: Path):
    result = posenc("compare", str(sweep), "--metric", "val/loss", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    report = (sweep / "report.md").read_text()
    fixed = next(line for line in report.splitlines() if line.startswith("**Held fixed:**"))
    varied = next(line for line in report.splitlines() if line.startswith("**Varied:**"))
    assert "model.n_layer=2" in fixed and "trainer.seq_len=32" in fixed and "model.flavor=llama" in fixed
    assert "encoding.name ∈ {alibi, learned, nope, rope}" in varied and "seed ∈ {0, 1, 2}" in varied
    assert "encoding.name" not in fixed
    assert "held fixed: " in result.stdout and "model.n_layer=2" in result.stdout
    # what varied and the result first, the keys every run shared last
    assert result.stdout.index("varied: ") < result.stdout.index("verdict on") < result.stdout.index("held fixed: ")
    assert report.index("**Varied:**") < report.index("**verdict on") < report.index("**Held fixed:**")
    assert "Held fixed:" in (sweep / "report.html").read_text()


def test_a_target_in_bits_per_byte_reads_val_bpb(sweep: Path):
    # make_run writes val/bpb = val/loss / ln 2 / 4: val/loss 3.0 is 1.082 bpb, 2.2 is 0.7934
    c = build_comparison(find_runs([sweep]), by=None, metric="val/loss", targets=["1bpb", "2.5"])
    assert [str(t) for t in c.targets] == ["2.5", "1bpb"]
    key = "convergence/tokens_to_bpb@1"
    rope = find_runs([sweep / "rope_1"])[0]
    losses = [3.5, 3.0, 2.2]
    bpb = [v / 0.6931471805599453 / 4 for v in losses]
    # crossing between the evaluations at 2000 tokens (bpb 1.082) and 3000 (bpb 0.793)
    expected = 2000 + 1000 * (bpb[1] - 1) / (bpb[1] - bpb[2])
    c1 = build_comparison([rope], by=[], metric="val/loss", targets=["1bpb"])
    assert c1.cells[("all runs", key)].mean == round(expected)
    assert any(col.key == key and col.header == "→1bpb" for col in c.columns)
    with pytest.raises(UserError, match="--target"):
        build_comparison(find_runs([sweep]), by=None, metric="val/loss", targets=["two"])


def test_a_single_run_is_reported_next_to_its_data_only_when_out_asks(sweep: Path, tmp_path: Path):
    result = posenc("compare", str(sweep / "rope_0"), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert not (sweep / "rope_0" / "report.md").exists() and not (tmp_path / "outputs").exists()
    result = posenc("compare", str(sweep / "rope_0"), "--out", str(sweep / "rope_0"), cwd=tmp_path)
    assert (sweep / "rope_0" / "report.md").exists() and not (tmp_path / "outputs").exists()


@pytest.fixture
def flavours(tmp_path: Path) -> Path:
    """rope and alibi under llama and gpt2, 2 seeds each: rope wins under llama, alibi under gpt2."""
    root = tmp_path / "flavours"
    finals = {("llama", "rope"): 2.0, ("llama", "alibi"): 2.3, ("gpt2", "rope"): 2.6, ("gpt2", "alibi"): 2.4}
    for (flavor, enc), final in finals.items():
        for seed in (0, 1):
            make_run(root, f"{flavor}_{enc}_{seed}", {"name": enc}, seed,
                     [f"encoding={enc}", f"model.flavor={flavor}", f"seed={seed}"], [3.0, final + 0.01 * seed],
                     config={"model": {"flavor": flavor}})
    return root


def test_within_ranks_the_groups_for_each_value_of_another_key(flavours: Path, tmp_path: Path):
    c = build_comparison(find_runs([flavours]), by=["encoding"], metric="val/loss", within="model.flavor")
    # a table cell never pools two flavours: rope at 2.0 under llama and 2.6 under gpt2 is no "rope ± 0.3"
    assert [g.label for g in c.groups] == ["encoding=alibi, flavor=gpt2", "encoding=alibi, flavor=llama",
                                           "encoding=rope, flavor=gpt2", "encoding=rope, flavor=llama"]
    assert list(c.rankings) == ["gpt2", "llama"]
    assert [(r.rank, r.label) for r in c.rankings["llama"].ranks] == [(1, "rope"), (2, "alibi")]
    assert [(r.rank, r.label) for r in c.rankings["gpt2"].ranks] == [(1, "alibi"), (2, "rope")]
    assert c.rankings["gpt2"].ranks[0].mean == pytest.approx(2.405)
    [agreement] = c.agreements  # one pair of values: the order is reversed, and clearly so at n = 2
    assert (agreement.u, agreement.v, agreement.tau) == ("gpt2", "llama", pytest.approx(-1.0))
    assert agreement.flips == (Flip("alibi", "rope", confident=True),)
    result = posenc("compare", str(flavours), "--by", "encoding", "--within", "model.flavor", "--metric", "val/loss",
                    cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert "model.flavor = gpt2: ranking by val/loss" in result.stdout
    assert "model.flavor = llama: ranking by val/loss" in result.stdout
    assert "Kendall's τ" in result.stdout and "-1.00" in result.stdout
    assert "alibi ahead of rope at gpt2" in result.stdout and "confident" in result.stdout
    assert "verdict on val/loss at model.flavor=gpt2: alibi is best" in result.stdout
    assert "verdict on val/loss at model.flavor=llama: rope is best" in result.stdout
    report = (flavours / "report_within-model.flavor.md").read_text()  # named by the options it was given
    assert "| gpt2 vs llama | alibi ahead of rope at gpt2 | rope ahead of alibi at llama | confident |" in report
    assert "![ranks_model.flavor](ranks_model.flavor.png)" in report
    # without --by, the within-key is not a group key of its own
    assert build_comparison(find_runs([flavours]), by=None, metric="val/loss", within="model.flavor").by == ["encoding"]


def test_a_rerun_on_another_device_or_resumed_is_a_duplicate_but_another_lr_is_not(tmp_path: Path):
    root = tmp_path / "reruns"
    make_run(root, "a", {"name": "rope"}, 0, ["encoding=rope"], [3.0, 2.0],
             config={"device": "cpu", "trainer": {"seq_len": 32, "lr": 0.002, "resume": False}, "logger": {"mode": "offline"}})
    make_run(root, "b", {"name": "rope"}, 0, ["encoding=rope"], [3.0, 2.1],
             config={"device": "cuda", "trainer": {"seq_len": 32, "lr": 0.002, "resume": True}, "logger": {"mode": "online"}})
    make_run(root, "c", {"name": "rope"}, 0, ["encoding=rope"], [3.0, 2.2],
             config={"device": "cpu", "trainer": {"seq_len": 32, "lr": 0.001, "resume": False}})
    c = build_comparison(find_runs([root]), by=["encoding"], metric="val/loss")
    assert [sorted([k.path.name, *(d.path.name for d in ds)]) for k, ds in c.duplicates] == [["a", "b"]]
    assert len(c.runs) == 2


def test_a_numeric_baseline_matches_however_it_is_typed(tmp_path: Path):
    root = tmp_path / "bases"
    for base in (100, 10000):
        for seed in (0, 1):
            make_run(root, f"{base}_{seed}", {"name": "rope", "base": base}, seed,
                     [f"encoding.base={base}", f"seed={seed}"], [3.0, 2.0 + seed / 10 + base / 1e5])
    for typed in ("10000", "1e4", "10000.0"):
        c = build_comparison(find_runs([root]), by=None, metric="val/loss", baseline=typed)
        assert c.baseline.label == "10000" and list(c.versus) == ["100"]


def test_task_runs_compare_as_accuracy_against_length_with_intervals(tmp_path: Path):
    """dataset=synthetic runs: one accuracy column per evaluated length (mean [95% interval],
    clipped to [0, 100%]), n/a where an encoding is not defined, and an accuracy figure."""
    root = tmp_path / "tasks"
    accuracy = {"rope": [(1.0, 0.5), (1.0, 0.3), (1.0, 0.4)], "learned": [(1.0, None), (1.0, None), (1.0, None)]}
    for name, rows in accuracy.items():
        for seed, (at_32, at_64) in enumerate(rows):
            make_run(root, f"{name}_{seed}", {"name": name}, seed, [f"encoding={name}", f"seed={seed}"], [1.0, 0.5],
                     extra={"tasks/flip_flop/accuracy@32": at_32, "tasks/flip_flop/accuracy@64": at_64})
    c = build_comparison(find_runs([root]), by=["encoding"], metric="tasks/flip_flop/accuracy@64")
    headers = [col.header for col in c.columns]
    assert "flip_flop acc@32" in headers and "flip_flop acc@64" in headers
    rope = c.cells[("rope", "tasks/flip_flop/accuracy@64")]
    assert rope.n == 3 and rope.mean == pytest.approx(0.4) and rope.low < 0.4 < rope.high
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["compare", str(root), "--by", "encoding", "--out", str(out),
                                      "--metric", "tasks/flip_flop/accuracy@64"])
    assert result.exit_code == 0, result.output
    report = (out / "report_tasks_flip_flop_accuracy@64.md").read_text()
    assert "100.0% [100.0%, 100.0%]" in report  # every seed solved it at the training length: zero width
    assert "40.0% [" in report
    assert (out / "accuracy_flip_flop.png").stat().st_size > 0


def test_fine_tunes_from_one_parent_per_seed_group_by_method_not_by_parent(tmp_path: Path):
    root = tmp_path / "extension"
    for seed in (0, 1):
        for method in ("linear", "yarn"):
            make_run(root, f"{method}_{seed}", {"name": "rope", "scaling": method}, seed,
                     [f"encoding.scaling={method}", f"trainer.init_from=/runs/parent_{seed}", f"seed={seed}"], [3.0, 2.0])
    c = build_comparison(find_runs([root]), by=None, metric="val/loss")
    assert c.by == ["encoding.scaling"] and [g.label for g in c.groups] == ["linear", "yarn"]


def test_compare_of_a_folder_holding_one_run_writes_nothing_there_and_says_how_to(tmp_path: Path):
    """One run (or one group) compares nothing: the terminal still shows its numbers, but no report
    or figure lands in the user's folder unless --out asks for one."""
    parent = tmp_path / "outputs" / "2026-11-22"
    make_run(parent, "16-58-28-111496_rope", {"name": "rope"}, 0, [], [3.0, 2.6, 2.2],
             config={"model": {"flavor": "llama", "n_layer": 2, "n_head": 2, "d_model": 32}})
    result = posenc("compare", str(parent), "--metric", "val/loss", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert written(tmp_path) == []
    assert "2.2000" in result.stdout and "no report written: one run" in result.stdout and "--out DIR" in result.stdout
    assert "nothing varies" not in result.stdout.split("grouped by ")[1].split("·")[0].replace("(one group: nothing varies)", "")
    out = tmp_path / "report"
    result = posenc("compare", str(parent), "--metric", "val/loss", "--out", str(out), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert (out / "report.md").is_file() and written(parent) == []
    report = (out / "report.md").read_text()
    assert "comparison: 1 run" in report and "1 runs" not in report and "by nothing varies" not in report


def test_the_terminal_names_the_headline_keys_held_fixed_and_counts_the_rest(sweep: Path, tmp_path: Path):
    """A real run's config has 50-70 keys: the terminal names the ones a reader checks first and
    counts the others, which report.md lists."""
    for run in sweep.iterdir():
        config = run / ".hydra" / "config.yaml"
        config.write_text(config.read_text() + "".join(f"extra_{i}: {i}\n" for i in range(50)))
    result = posenc("compare", str(sweep), "--metric", "val/loss", cwd=tmp_path)
    line = next(line for line in result.stdout.splitlines() if line.startswith("held fixed: "))
    assert "model.n_layer=2" in line and "trainer.seq_len=32" in line and "extra_" not in line
    assert re.search(r"and 50 more keys \(report.md lists every one\)", line)
    assert "extra_49=49" in (sweep / "report.md").read_text()


def test_a_narrow_tables_title_stays_on_one_line(sweep: Path, tmp_path: Path):
    """The convergence table has two narrow columns and a long title: the title sets the table's
    width (up to the terminal's), so it is not wrapped mid-phrase."""
    result = posenc("compare", str(sweep), "--metric", "val/loss", "--target", "3.2", cwd=tmp_path)
    titles = [line for line in result.stdout.splitlines() if line.startswith("tokens to reach val/loss")]
    assert titles and titles[0].rstrip().endswith("— mean [95% interval over seeds]"), result.stdout
