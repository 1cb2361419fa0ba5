"""`posenc compare` says no more than it knows: intervals of positive metrics that stay
positive and agree between tables and figures, emphasis only where a difference is detectable,
per-seed values, a verdict by default, task runs led by accuracy, timings flagged as single runs
on a loaded machine; and its rough edges: what varied and was held fixed, a --by typo,
figures of an earlier compare."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from test_compare import make_run, ppl_at
from test_compare_verdicts import posenc
from test_plots import SHAPE, figures  # noqa: F401  (a fixture)

from posenc.record.metrics import TOKENS_PER_S
from posenc.report.compare import compare
from posenc.report.stats import aggregate, scale_of
from posenc.report.tables import format_stat

SKEWED = {"100": [9.79, 12.09], "10000": [8.5, 8.9]}  # RoPE bases, perplexity of seeds 0 and 1


@pytest.fixture
def bases(tmp_path: Path) -> Path:
    """A RoPE base sweep with 2 seeds: perplexities as the issue saw them, val/loss = ln ppl."""
    root = tmp_path / "bases"
    for base, ppls in SKEWED.items():
        for seed, ppl in enumerate(ppls):
            make_run(root, f"{base}_{seed}", {"name": "rope", "base": float(base), "max_len": "${trainer.seq_len}"},
                     seed, [f"encoding.base={base}", f"seed={seed}"], [3.5, 3.0, math.log(ppl)], config=SHAPE,
                     extra={"val/ppl": ppl, **ppl_at({32: ppl, 64: 1.5 * ppl})})
    return root


def table(report: str, title: str) -> str:
    """The Markdown table under the first bold title starting with `title`."""
    return report.split(f"**{title}")[1].split("\n\n")[1]


def cell(text: str, row: str, column: int) -> str:
    """The text of a cell of the first Markdown table row starting with `| row |`."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {row} |"))
    return line.split(" | ")[column].strip(" |")


def interval(text: str) -> tuple[float, float, float]:
    mean, low, high = (float(x) for x in re.findall(r"-?\d+\.\d+", text))
    return mean, low, high


def test_perplexity_intervals_are_positive_and_the_figures_draw_the_tables_interval(bases: Path, figures: list):
    compare([bases])
    report = (bases / "report.md").read_text()
    quality = table(report, "quality — mean")
    # base 100, seeds 9.79 and 12.09: the interval [2.85, 41.6] is wider than its mean, no number
    assert cell(quality, "100", 3) == "n=2, too few to bound: 9.790 / 12.090"
    low, high = aggregate([9.79, 12.09], scale_of("val/ppl")).low, aggregate([9.79, 12.09], scale_of("val/ppl")).high
    assert 0 < low < 9.79 and high > 12.09
    mean, low_10k, high_10k = interval(cell(quality, "10000", 3))  # seeds 8.5 and 8.9: an interval that bounds
    assert 0 < low_10k < 8.5 and high_10k > 8.9 and mean == pytest.approx(math.sqrt(8.5 * 8.9), abs=1e-3)
    _, loss_low, loss_high = interval(cell(quality, "10000", 2))  # the same interval on the loss scale
    assert (low_10k, high_10k) == pytest.approx((math.exp(loss_low), math.exp(loss_high)), rel=1e-3)
    for text in re.findall(r"\[(-?[\d.]+), ", report):
        assert float(text) > 0
    at_32 = interval(cell(table(report, "perplexity at evaluation length (tokens) — mean"), "10000", 2))
    assert at_32 == pytest.approx((mean, low_10k, high_10k), rel=1e-4)  # the same seeds' perplexity, the same interval
    extrapolation = next(f for f in figures if "Perplexity against length" in f.axes[0].get_title())
    bands = [c for c in extrapolation.axes[0].collections if isinstance(c, PolyCollection)]
    lowest = min(float(p.vertices[:, 1].min()) for band in bands for p in band.get_paths())
    assert lowest == pytest.approx(low, rel=1e-3)  # the band is the table's interval, not cut at some floor
    final = next(f for f in figures if f.axes[0].get_title().startswith("Final val/ppl"))
    bar_ends = [seg[:, 1] for c in final.axes[0].collections for seg in c.get_segments()]
    assert min(float(e.min()) for e in bar_ends) == pytest.approx(low, rel=1e-3)


def test_nothing_is_bold_where_the_lead_is_not_detectable(bases: Path, tmp_path: Path):
    result = posenc("compare", str(bases), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    report = (bases / "report.md").read_text()
    quality = table(report, "quality — mean")
    assert "**" not in quality and "| best (Welch 95%) |  | tied: 10000, 100 |" in quality
    assert "verdict on val/ppl: no detectable best — 10000, 100 tied" in result.stdout


def test_a_detectable_lead_is_bold_and_named(tmp_path: Path):
    root = tmp_path / "clear"
    for enc, finals in (("rope", [2.0, 2.01, 2.02]), ("learned", [3.0, 3.01, 3.02])):
        for seed, final in enumerate(finals):
            make_run(root, f"{enc}_{seed}", {"name": enc}, seed, [f"encoding={enc}", f"seed={seed}"], [3.5, final])
    result = posenc("compare", str(root), "--metric", "val/loss", cwd=tmp_path)
    report = (root / "report.md").read_text()
    assert "| rope | 3 (0,1,2) | **2.0100 [" in report and "| best (Welch 95%) |  | rope |" in report
    assert "verdict on val/loss: rope is best" in result.stdout


def test_per_seed_values_are_in_the_report_and_behind_a_flag_in_the_terminal(bases: Path, tmp_path: Path):
    quiet = posenc("compare", str(bases), cwd=tmp_path)
    assert "9.790, 12.090" not in quiet.stdout
    assert "| 100 | 2 (0,1) | 2.2814, 2.4924 | 9.790, 12.090 |" in (bases / "report.md").read_text()
    loud = posenc("compare", str(bases), "--seeds", cwd=tmp_path)
    assert loud.exit_code == 0 and "9.790, 12.090" in loud.stdout


def test_the_ranking_and_its_rank_intervals_are_printed_and_reported(bases: Path, tmp_path: Path):
    result = posenc("compare", str(bases), "--by", "encoding.base", cwd=tmp_path)
    assert "ranking by val/ppl (1 = best)" in result.stdout and "rank interval (Welch 95%)" in result.stdout
    report = (bases / "report.md").read_text()
    # 2 seeds each, tied: both can be first or second, never a single rank
    assert re.search(r"\| 1 \| 10000 \| 2 \(0,1\) \| [\d.]+ \[[\d.]+, [\d.]+\] \| \[1, 2\] \|", report)
    assert re.search(r"\| 2 \| 100 \| 2 \(0,1\) \| n=2, too few to bound: 9.790 / 12.090 \| \[1, 2\] \|", report)
    assert "verdict on val/ppl: no detectable best — 10000, 100 tied" in result.stdout
    assert "add seeds: seed=2,3 with the same command (seed=0,1,2,3 in all)" in result.stdout


def test_one_seed_per_group_gives_no_verdict_and_says_how_to_get_one(tmp_path: Path):
    root = tmp_path / "one"
    for enc, final in (("rope", 2.0), ("alibi", 2.5)):
        make_run(root, enc, {"name": enc}, 0, [f"encoding={enc}"], [3.0, final])
    result = posenc("compare", str(root), cwd=tmp_path)
    assert "verdict on val/loss: none (1 seed per group" in result.stdout
    assert "add seeds: seed=1,2 with the same command (seed=0,1,2 in all)" in result.stdout
    assert "| 1 | rope | 1 (0) | 2.0000 | — (1 seed per group) |" in (root / "report.md").read_text()  # no fake certainty
    assert "**" not in table((root / "report.md").read_text(), "quality — mean")


def task_sweep(root: Path) -> Path:
    """flip-flop runs whose task loss starts below every text target (1.0 at the first evaluation)."""
    for name, rows in {"rope": [(1.0, 0.5), (1.0, 0.4)], "nope": [(0.6, 0.1), (0.8, 0.0)]}.items():
        for seed, (at_32, at_64) in enumerate(rows):
            make_run(root, f"{name}_{seed}", {"name": name}, seed, [f"encoding={name}", f"seed={seed}"], [1.0, 0.5],
                     extra={"tasks/flip_flop/accuracy@32": at_32, "tasks/flip_flop/accuracy@64": at_64,
                            "val/ppl": math.exp(0.5)})
    return root


def test_a_task_run_leads_with_accuracy_and_drops_targets_its_loss_never_crossed(tmp_path: Path):
    root = task_sweep(tmp_path / "tasks")
    result = posenc("compare", str(root), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    report = (root / "report.md").read_text()
    tables = re.findall(r"^\*\*(.+?) — mean \[95% interval over seeds\]\*\*$", report, flags=re.M)
    assert tables[0].startswith("task accuracy")
    assert "→2.5" not in report and "val/ppl |" not in report  # the text targets and a task's "perplexity"
    # the default targets are language-modelling losses: no task run takes them
    assert "→2" not in report and "convergence targets left out" not in result.stdout
    assert "ranking by tasks/flip_flop/accuracy@32" in result.stdout  # the accuracy at the training length


def test_a_target_reached_at_the_first_evaluation_says_so_instead_of_a_token_count(tmp_path: Path):
    root = task_sweep(tmp_path / "tasks")
    posenc("compare", str(root), "--target", "1.2", "--target", "0.8", cwd=tmp_path)
    report = (root / "report_targets-1.2,0.8.md").read_text()
    tokens = table(report, "tokens to reach val/loss")
    assert cell(tokens, "rope", 2) == "≤ first eval"  # 1.0 at the first evaluation is already below 1.2
    assert cell(tokens, "rope", 3).endswith("]")  # 0.8: crossed between the two evaluations, a token count


def test_timings_are_never_bold_and_a_loaded_machine_is_flagged(tmp_path: Path):
    root = tmp_path / "cost"
    for enc, rate, load in (("sinusoidal", 1891.0, 4.5), ("rope", 757.0, 4.4)):
        for seed in range(3):
            make_run(root, f"{enc}_{seed}", {"name": enc}, seed, [f"encoding={enc}", f"seed={seed}"], [3.0, 2.0 + seed / 10],
                     extra={"tokens_per_s": rate + seed, "machine/load_1m": load, "machine/cpus": 2})
    result = posenc("compare", str(root), cwd=tmp_path)
    report = (root / "report.md").read_text()
    cost = table(report, "cost — ")
    assert "**" not in cost and "1,892 [" in cost and "4.5 on 2 CPUs ⚠ loaded" in cost
    assert "timed once while it trained, not a benchmark" in report
    assert "6 of 6 runs ended with the machine loaded" in result.stdout.replace("\n", " ")


def test_cpu_runs_on_different_thread_counts_are_named_and_like_ones_are_not(tmp_path: Path):
    """A loaded machine trains on fewer torch threads (posenc.hardware.choose_cpu_threads): a CPU step's
    sums, and so the run's numbers, change in their last bits with the count, which compare says."""
    root = tmp_path / "threads"
    for enc, threads in (("rope", 2), ("nope", 1)):
        for seed in range(2):
            make_run(root, f"{enc}_{seed}", {"name": enc}, seed, [f"encoding={enc}", f"seed={seed}"], [3.0, 2.0 + seed / 10],
                     extra={"device": "cpu", "machine/threads": threads})
    said = posenc("compare", str(root), cwd=tmp_path).stdout.replace("\n", " ")
    assert "the CPU runs trained on different torch thread counts (1, 2" in said
    assert "different torch thread counts" in (root / "report.md").read_text()
    for run in root.glob("nope_*"):  # every run on 2 threads: nothing to say
        (run / "summary.json").write_text((run / "summary.json").read_text().replace('"machine/threads": 1', '"machine/threads": 2'))
    assert "thread counts" not in posenc("compare", str(root), cwd=tmp_path).stdout


def test_varied_names_only_what_varied_and_held_fixed_is_resolved(tmp_path: Path):
    root = tmp_path / "mixed"
    for enc, options in (("rope", {"base": 10000.0, "style": "half", "max_len": "${trainer.seq_len}"}),
                         ("alibi", {"max_len": "${trainer.seq_len}"})):
        for seed in (0, 1):
            make_run(root, f"{enc}_{seed}", {"name": enc, **options}, seed, [f"encoding={enc}", f"seed={seed}"], [3.0, 2.0])
    result = posenc("compare", str(root), cwd=tmp_path)
    varied = next(line for line in result.stdout.splitlines() if line.startswith("varied:"))
    assert varied == "varied: encoding.name ∈ {alibi, rope}; seed ∈ {0, 1}"  # not rope's own base and style
    report = (root / "report.md").read_text()
    assert "encoding.max_len=32" in report and "${" not in result.stdout + report


def test_a_path_typo_names_the_nearest_path_that_exists(bases: Path, tmp_path: Path):
    """A run or sweep directory mistyped, or pasted with the README's placeholders: one line naming
    the directory it most likely meant."""
    sweep = tmp_path / "outputs" / "sweeps" / "2026-11-29" / "04-35-49-624364_base-10,1000,100000_seed-0,1"
    sweep.parent.mkdir(parents=True)
    bases.rename(sweep)
    for typed in (str(sweep).replace("base-10,", "base-1,"), "outputs/sweeps/<date>/<time>_base-10,1000,100000_seed-0,1"):
        result = posenc("compare", typed, cwd=tmp_path)
        assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
        near = result.stderr.split("did you mean ", 1)[1].split("? (", 1)[0]
        assert (tmp_path / near).resolve() == sweep.resolve(), result.stderr
    result = posenc("compare", "nothing/like/it", cwd=tmp_path)
    assert "does not exist — give a run directory" in result.stderr and "did you mean" not in result.stderr


def test_a_by_typo_names_the_closest_keys_not_every_key(tmp_path: Path):
    root = tmp_path / "wide"
    config = {"model": {f"option_{i}": i for i in range(40)}}
    for base in (100, 10000):
        make_run(root, str(base), {"name": "rope", "base": base}, 0, [f"encoding.base={base}"], [3.0, 2.0], config=config)
    result = posenc("compare", str(root), "--by", "encoding.bas", cwd=tmp_path)
    line = result.stderr.strip()
    listed = line.split("use one of: ")[1].split(" (and ")[0].split(", ")
    assert result.exit_code == 1 and listed[0] == "encoding.base" and len(listed) <= 8
    assert re.search(r"\(and \d+ more\)$", line)


def test_plot_extrapolation_leaves_compares_figure_alone_and_says_what_its_band_is(bases: Path, tmp_path: Path):
    posenc("compare", str(bases), cwd=tmp_path)
    before = (bases / "extrapolation.png").read_bytes()
    result = posenc("plot", "extrapolation", str(bases), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    # the same figure twice in one folder is one too many: compare's is named, not copied
    assert (bases / "extrapolation.png").read_bytes() == before and not (bases / "ppl_by_length.png").exists()
    assert f"not written: {bases / 'extrapolation.png'} is this figure" in " ".join(result.stdout.split())
    result = posenc("plot", "extrapolation", str(bases), "--out", str(tmp_path / "copy.png"), cwd=tmp_path)
    assert result.exit_code == 0 and (tmp_path / "copy.png").exists()
    helptext = posenc("plot", "extrapolation", "--help", cwd=tmp_path).stdout
    assert "95% interval" in helptext and "std" not in helptext


def test_two_compares_with_other_options_leave_both_reports_and_the_same_one_replaces_its_own(bases: Path,
                                                                                              tmp_path: Path):
    """The README's two compares of one sweep, run in order: the second (--metric) writes its own
    report and figure beside the first, and says the first is there; the same compare again
    replaces only its own files, and says so; a figure only its earlier version showed is removed,
    one another report shows is kept, the user's own file never touched."""
    first = posenc("compare", str(bases), cwd=tmp_path)
    assert first.exit_code == 0, first.stderr
    plain = (bases / "report.md").read_text()
    (bases / "mine.png").write_bytes(b"\x89PNG")  # the user's own file: never touched
    second = posenc("compare", str(bases), "--metric", "extrapolation/ppl@64", cwd=tmp_path)
    assert second.exit_code == 0, second.stderr
    assert (bases / "report.md").read_text() == plain and (bases / "report.html").is_file()
    own = (bases / "report_extrapolation_ppl@64.md").read_text()
    assert "![final_extrapolation_ppl@64](final_extrapolation_ppl@64.png)" in own
    assert (bases / "final_val_ppl.png").exists() and (bases / "final_extrapolation_ppl@64.png").exists()
    said = " ".join(second.stdout.split())
    assert "left beside it: report.html" in said and "replaced" not in said

    (bases / "report_extrapolation_ppl@64.md").write_text(own + "![stale](stale.png)\n![final_val_ppl](final_val_ppl.png)\n")
    (bases / "stale.png").write_bytes(b"\x89PNG")
    again = posenc("compare", str(bases), "--metric", "extrapolation/ppl@64", cwd=tmp_path)
    said = " ".join(again.stdout.split())
    assert "replaced the earlier report_extrapolation_ppl@64.md and .html (the same options), and removed the " \
           "figures only it showed: stale.png" in said
    assert not (bases / "stale.png").exists()
    assert (bases / "final_val_ppl.png").exists() and (bases / "mine.png").exists()  # report.md shows the first


def test_an_interval_wider_than_its_mean_is_no_number_and_the_seeds_are_shown_instead():
    """Issue 36: tokens/s of 2 seeds printed as `1,301 [6, 272,431]`."""
    wild = aggregate([300.0, 5640.0], scale_of(TOKENS_PER_S.name))
    assert wild.high - wild.low > wild.mean and format_stat(wild, "rate") == "n=2, too few to bound: 300 / 5,640"
    steady = aggregate([1290.0, 1310.0], scale_of(TOKENS_PER_S.name))  # two seeds that agree do bound it
    assert not steady.says_nothing and re.fullmatch(r"1,300 \[[\d,]+, [\d,]+\]", format_stat(steady, "rate"))
    accuracy = scale_of("tasks/flip_flop/accuracy@32")  # bounded both ways: wider than half of [0, 1] says nothing
    assert format_stat(aggregate([0.5, 0.3, 0.4], accuracy), "accuracy").startswith("40.0% [")
    assert format_stat(aggregate([0.9, 0.1], accuracy), "accuracy") == "n=2, too few to bound: 90.0% / 10.0%"


def test_the_summary_flag_of_a_target_passed_before_the_first_evaluation_is_what_compare_reads(tmp_path: Path):
    """summary.json says a tokens-to-target count is only a bound (convergence/before_first_eval_loss@x):
    compare treats it as censored even where the run's metrics.jsonl is gone."""
    from posenc.record.metrics import Target, convergence_metrics
    from posenc.report.compare import at_first_eval
    from posenc.report.runs import find_runs

    rows = [{"step": 10, "tokens": 6656, "val/loss": 0.9}, {"step": 20, "tokens": 13312, "val/loss": 0.4}]
    flags = convergence_metrics(rows, [2.0])
    run = make_run(tmp_path / "r", "rope_0", {"name": "rope"}, 0, ["seed=0"], [0.9, 0.4], extra=flags)
    (run / "metrics.jsonl").write_text("")  # the curve gone (copied without it, or trimmed)
    [found] = find_runs([run])
    assert found.rows == [] and at_first_eval(found, Target(2.0))  # no curve left: the flag decides
