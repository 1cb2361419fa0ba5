"""The figures a paper could print: one look per encoding everywhere, legends that cover no data,
titles that state the setup, tick labels that do not collide, no matplotlib warnings, and every
PNG next to its data or where --out says, never in the current directory."""

from __future__ import annotations

import colorsys
import itertools
import math
import warnings
from pathlib import Path

import matplotlib.colors as mcolors
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import posenc.report.plots as plots
import posenc.report.plots_final as plots_final
import posenc.report.plots_length as plots_length
import posenc.report.plots_rank as plots_rank
from posenc.report.compare import compare
from posenc.report import spread, style
from posenc.report.style import ENCODING_STYLES, styles_for
from test_compare import make_run, ppl_at
from test_compare_verdicts import flavours, posenc  # noqa: F401  (flavours: a fixture)

SHAPE = {"model": {"flavor": "llama", "n_layer": 2, "n_head": 2, "d_model": 32}}


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every matplotlib figure the report code saves, kept for inspection."""
    saved = []
    real = plots.save_figure

    def keep(fig, path):
        saved.append(fig)
        return real(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    monkeypatch.setattr(plots_final, "save_figure", keep)
    monkeypatch.setattr(plots_length, "save_figure", keep)
    monkeypatch.setattr(plots_rank, "save_figure", keep)
    return saved


def sweep_of(root: Path, encodings: dict[str, list[float]], evals: int = 3) -> Path:
    for enc, finals in encodings.items():
        for seed, final in enumerate(finals):
            losses = [3.5, 3.0][: evals - 1] + [final]
            make_run(root, f"{enc}_{seed}", {"name": enc}, seed, [f"encoding={enc}", f"seed={seed}"], losses,
                     config=SHAPE, extra={"tokens": 3000, **ppl_at({32: 8 + final, 64: 9 + 2 * final})})
    return root


def renderer_of(fig):
    """Draw a saved (closed) figure again on an Agg canvas, for the extents of its artists."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def drawn_colours(fig) -> dict[str, str]:
    """legend label (before ' (n=') -> the hex colour of the line or bar it names."""
    out = {}
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            colour = handle.get_color() if hasattr(handle, "get_color") else handle.patches[0].get_facecolor()
            out[label.split(" (n=")[0]] = mcolors.to_hex(colour)
    return out


def test_an_encoding_has_one_colour_in_every_figure_whatever_else_is_compared(tmp_path: Path, figures: list):
    compare([sweep_of(tmp_path / "a", {"rope": [2.0, 2.2], "alibi": [2.1, 2.3]})], metric="val/loss")
    compare([sweep_of(tmp_path / "b", {"rope": [2.0, 2.2], "learned": [3.0, 3.1], "nope": [2.9, 3.0]})],
            metric="val/loss")
    seen = [drawn_colours(fig) for fig in figures]
    rope = {colours["rope"] for colours in seen if "rope" in colours}
    assert rope == {ENCODING_STYLES["rope"].color}
    assert {c["alibi"] for c in seen if "alibi" in c} == {ENCODING_STYLES["alibi"].color}
    assert sum("rope" in colours for colours in seen) >= 5  # convergence, tokens-to-loss, extrapolation, twice


def test_each_encoding_is_told_apart_and_other_labels_keep_their_colour():
    looks = {(s.color, s.linestyle) for s in ENCODING_STYLES.values()}
    assert len(looks) == len(ENCODING_STYLES)
    bases = ["100", "1e4", "5e5"]
    first, again = styles_for(bases), styles_for(list(reversed(bases)))
    assert first == again  # the same labels, in any order: the same colours
    assert len({s.color for s in first.values()}) == 3


def legends_of(fig) -> list:
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def test_legends_sit_under_the_axes_add_no_empty_column_and_titles_state_the_setup(tmp_path: Path, figures: list):
    compare([sweep_of(tmp_path / "s", {"rope": [2.0, 2.2, 2.4], "alibi": [2.1, 2.3, 2.5]})], metric="val/loss")
    assert len(figures) == 4
    legends = 0
    for fig in figures:
        renderer = renderer_of(fig)
        ax = fig.axes[0]
        plot = ax.get_tightbbox(renderer)  # the axes with their tick and axis labels
        for legend in legends_of(fig):
            legends += 1
            box = legend.get_window_extent(renderer)
            assert box.y1 <= plot.y0 + 1  # under the axes and their labels: it covers no data
            assert plot.x0 - 1 <= box.x0 and box.x1 <= plot.x1 + 1  # no wider than the axes: no column of its own
            rows = {round(t.get_window_extent(renderer).y0) for t in legend.get_texts()}
            assert len(rows) == 1  # two groups and a line fit side by side: one row, not a column
        saved = fig.get_tightbbox(renderer).width * fig.dpi  # inches -> pixels: the PNG's width
        assert saved == pytest.approx(plot.width, abs=2)
        title = ax.get_title()
        assert "llama 2L×2H d=32" in title and "T=32" in title and "3k tokens" in title and "seeds 0,1,2" in title
    assert legends == 3  # convergence, tokens to target, extrapolation (final: the points are labelled on the axis)


def test_the_interval_is_named_only_when_one_is_drawn(tmp_path: Path, figures: list):
    """One seed per group: no band, no error bar, so no legend title or title note about one (the
    legend's title names only what its entries are, the swept key); two seeds: the legend says what
    the line and the band are."""
    compare([sweep_of(tmp_path / "one", {"rope": [2.0], "alibi": [2.1]})], metric="val/loss")
    single = list(figures)
    assert single
    for fig in single:
        assert all(legend.get_title().get_text() in ("encoding", "encoding (n = seeds)") for legend in legends_of(fig))
        assert "95% interval" not in fig.axes[0].get_title()  # it names no interval it does not draw,
        assert "1 seed per group: no intervals" in fig.axes[0].get_title()  # and says why there is none
    figures.clear()
    compare([sweep_of(tmp_path / "two", {"rope": [2.0, 2.2], "alibi": [2.1, 2.3]})], metric="val/loss")
    notes = {legend.get_title().get_text() for fig in figures for legend in legends_of(fig)}
    assert "encoding (n = seeds) · line: mean over seeds · band: 95% interval" in notes  # convergence: arithmetic
    assert "encoding (n = seeds) · line: geometric mean over seeds · band: 95% interval" in notes  # extrapolation


def test_convergence_y_range_holds_every_target_and_its_label(tmp_path: Path, figures: list):
    """A target crossed between the first and second evaluation lies above the zoomed range of
    the later ones; its line and label must still be inside the axes."""
    root = tmp_path / "fast"
    for seed, final in enumerate([2.30, 2.35]):
        make_run(root, f"rope_{seed}", {"name": "rope"}, seed, ["encoding=rope", f"seed={seed}"],
                 [3.5, 2.42, final], config=SHAPE)
    compare([root], metric="val/loss", targets=["2.5"], out=tmp_path / "report")  # one group: only with --out
    [fig] = [f for f in figures if f.axes[0].get_title().startswith("Validation loss")]
    ax = fig.axes[0]
    renderer = renderer_of(fig)
    low, high = ax.get_ylim()
    [label] = [t for t in ax.texts if t.get_text() == "target 2.5"]
    assert low < 2.5 < high
    box, inside = label.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1


def test_long_group_labels_do_not_collide(tmp_path: Path, figures: list):
    root = tmp_path / "long"
    for i in range(8):
        make_run(root, f"r{i}", {"name": "rope", "style": f"a_rather_long_variant_name_{i}"}, 0,
                 [f"encoding.style=a_rather_long_variant_name_{i}"], [3.0, 2.0 + i / 10], config=SHAPE)
    compare([root], metric="val/loss")
    final = next(fig for fig in figures if "Final" in fig.axes[0].get_title())
    renderer = renderer_of(final)
    ax = final.axes[0]
    boxes = [label.get_window_extent(renderer) for label in ax.get_xticklabels() + ax.get_yticklabels()
             if label.get_text().startswith("a_rather")]
    assert len(boxes) == 8
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def test_no_matplotlib_warning_leaks_even_from_a_single_evaluation(tmp_path: Path):
    """One evaluation per run (a flat curve) and a group whose only run failed."""
    root = sweep_of(tmp_path / "flat", {"rope": [2.0, 2.2], "alibi": [2.1]}, evals=1)
    make_run(root, "learned_0", {"name": "learned"}, 0, ["encoding=learned", "seed=0"], [3.0], status="failed",
             config=SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare([root], metric="val/loss")
    assert (root / "convergence.png").exists()


def test_plot_commands_write_next_to_the_data_or_into_out_never_the_current_directory(tmp_path: Path):
    root = sweep_of(tmp_path / "s", {"rope": [2.0, 2.2]})
    result = posenc("plot", "extrapolation", str(root), cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert (root / "ppl_by_length.png").exists()
    result = posenc("plot", "decay", "--out", "figs", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "figs" / "rope_decay.png").read_bytes()[:4] == b"\x89PNG"
    assert list(tmp_path.glob("*.png")) == [] and not (tmp_path / "figs").is_file()


def test_the_rank_figure_draws_each_encodings_rank_against_the_key_best_on_top(flavours: Path, figures: list):
    compare([flavours], by=["encoding"], metric="val/loss", within="model.flavor")
    [fig] = [f for f in figures if f.axes[0].get_title().startswith("Rank by val/loss against model.flavor")]
    ax = fig.axes[0]
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # rank 1 at the top
    assert [t.get_text() for t in ax.get_xticklabels()] == ["gpt2", "llama"]
    ranks = {bars.get_label(): list(bars.lines[0].get_ydata()) for bars in ax.containers}  # errorbar: (line, caps, bars)
    assert ranks == {"alibi": [1, 2], "rope": [2, 1]}  # alibi leads under gpt2, rope under llama
    colours = {bars.get_label(): mcolors.to_hex(bars.lines[0].get_color()) for bars in ax.containers}
    assert colours == {"alibi": ENCODING_STYLES["alibi"].color, "rope": ENCODING_STYLES["rope"].color}


def test_every_evaluation_of_the_convergence_curve_is_on_the_chart(tmp_path: Path, figures: list):
    """Issue 47: the y-axis was zoomed from the second evaluation down, so the first ones (5.5 nats
    on bytes) were off the chart; every point is inside the axes now, on a log axis."""
    root = tmp_path / "early"
    for enc, final in (("rope", 1.9), ("alibi", 2.0)):
        for seed in (0, 1):
            make_run(root, f"{enc}_{seed}", {"name": enc}, seed, [f"encoding={enc}", f"seed={seed}"],
                     [5.55, 4.1, 3.3, 2.6, 2.2, final + 0.01 * seed], config=SHAPE)
    compare([root], metric="val/loss")
    [fig] = [f for f in figures if f.axes[0].get_title().startswith("Validation loss")]
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    values = [y for line in ax.get_lines() for y in line.get_ydata() if line.get_label().endswith("(n=2)")]
    assert values and low < min(values) and max(values) == pytest.approx(5.55) and 5.55 < high
    assert ax.get_yscale() == "log"


def base_sweep(root: Path, finals: dict[str, list[float]]) -> Path:
    """A sweep of RoPE bases (one encoding, one family), val/ppl and ppl@1×..16× ≈ e^loss, T=32."""
    for base, losses in finals.items():
        for seed, final in enumerate(losses):
            make_run(root, f"{base}_{seed}", {"name": "rope", "base": float(base)}, seed,
                     [f"encoding.base={base}", f"seed={seed}"], [3.5, 3.0, final], config=SHAPE,
                     extra={"val/ppl": math.exp(final), **ppl_at({32: math.exp(final), 512: math.exp(final + 0.3)})})
    return root


def test_one_seed_figures_say_so_and_never_zoom_below_the_seed_spread(tmp_path: Path, figures: list):
    """Issue 53: three bases within 0.3% of each other, one seed each, filled their figures' y-axes,
    noise read as a result. Each figure now says 1 seed in its title, and the axis holds every point
    ± 2 sd of the spread seeds produce (the measured one: no group here has seeds)."""
    close = {"10000": [2.7400], "100000": [2.7415], "1000000": [2.7430]}  # perplexities 0.3% apart
    compare([base_sweep(tmp_path / "one", close)], metric="val/ppl")
    final = next(f for f in figures if f.axes[0].get_title().startswith("Final val/ppl"))
    length = next(f for f in figures if "against length" in f.axes[0].get_title())
    for fig, sd in ((final, spread.interpolated(spread.SEED_SD_LOG_PPL, 1)),
                    (length, spread.interpolated(spread.SEED_SD_LOG_PPL, 512 / 32))):
        ax = fig.axes[0]
        assert "1 seed per group: no intervals" in ax.get_title() and "seed noise" in ax.get_title()
        low, high = ax.get_ylim()
        top = max(y for line in ax.get_lines() for y in line.get_ydata() if line.get_label() != "training length")
        assert high >= top * math.exp(2 * sd) * 0.999  # the highest point keeps its 2 sd of room
        at_1x = [line.get_ydata()[0] for line in ax.get_lines() if line.get_label() != "training length"]
        assert (max(at_1x) - min(at_1x)) / (high - low) < 0.2  # the 0.3% gap fills a small part of the axis
    assert all("1 seed per group" in f.axes[0].get_title() for f in figures)


def test_seeds_of_the_runs_themselves_set_the_floor_and_draw_their_bands(tmp_path: Path, figures: list):
    runs = base_sweep(tmp_path / "mixed", {"10000": [2.70, 2.76, 2.73], "100000": [2.74]})
    compare([runs], metric="val/ppl")
    final = next(f for f in figures if f.axes[0].get_title().startswith("Final val/ppl"))
    title = final.axes[0].get_title()
    assert "1 of 2 groups with 1 seed" in title and "these runs' seeds" in title and "bar: 95% interval" in title
    [own] = [s for s in [spread.pooled("val/ppl", [[math.exp(v) for v in (2.70, 2.76, 2.73)], [2.74]])] if s]
    assert own.sd == pytest.approx(0.03) and own.source == "these runs' seeds"


def test_a_sweep_of_one_encodings_option_is_drawn_in_colours_shapes_and_dashes_of_its_own(tmp_path: Path,
                                                                                           figures: list):
    """Issue 53: bases 10000 and 1000000 were two similar browns with the same marker, and three
    curves lying on each other showed only the last drawn. Now neighbours differ in hue (colour-blind
    safe palette), each has its own open marker and line style, the first drawn is the widest."""
    compare([base_sweep(tmp_path / "b", {b: [2.74, 2.75] for b in ("10000", "100000", "1000000")})], metric="val/ppl")
    convergence = next(f for f in figures if f.axes[0].get_title().startswith("Validation loss"))
    lines = [line for line in convergence.axes[0].get_lines() if "(n=" in line.get_label()]
    assert [line.get_label().split(" ")[0] for line in lines] == ["10000", "100000", "1000000"]
    assert len({line.get_color() for line in lines}) == len({line.get_marker() for line in lines}) == 3
    assert len({line.get_linestyle() for line in lines}) == 3
    assert all(line.get_markerfacecolor() == "none" for line in lines)
    assert [line.get_linewidth() for line in lines] == sorted((line.get_linewidth() for line in lines), reverse=True)
    hues = [colorsys.rgb_to_hsv(*mcolors.to_rgb(line.get_color()))[0] * 360 for line in lines]
    assert all(min(abs(a - b), 360 - abs(a - b)) > 60 for a, b in zip(hues, hues[1:]))  # neighbours: other hues


def test_neighbouring_colours_of_the_palette_differ_in_hue():
    def hue(c: str) -> float | None:  # None: black or grey, no hue to confuse
        rgb = mcolors.to_rgb(c)
        return colorsys.rgb_to_hsv(*rgb)[0] * 360 if max(rgb) - min(rgb) > 0.2 else None

    pairs = [(hue(a), hue(b)) for a, b in zip(style.PALETTE, style.PALETTE[1:])]
    assert all(min(abs(a - b), 360 - abs(a - b)) > 45 for a, b in pairs if a is not None and b is not None), pairs
    assert len(set(style.PALETTE)) == len(style.PALETTE) >= 16


def test_the_measured_seed_spread_is_the_shipped_baselines(tmp_path: Path):
    """report/spread.py's numbers, recomputed from the leaderboard's shipped per-seed values: the sd
    over seeds (of ln ppl; of accuracy) pooled over encodings, at each multiple of the training length."""
    import json

    import numpy as np

    shipped = json.loads((Path(__file__).resolve().parents[1] / "posenc" / "leaderboard" / "baselines"
                          / "posenc-pe-v2.json").read_text())

    def pooled(key: str, log: bool) -> float:
        variances = [np.var(np.log(v) if log else v, ddof=1) for row in shipped["rows"].values()
                     if (v := row["values"].get(key)) and None not in v]
        return float(np.sqrt(np.mean(variances)))

    for (multiple, sd), length in zip(spread.SEED_SD_LOG_PPL, (64, 256, 1024)):
        assert sd == pytest.approx(pooled(f"extrapolation/ppl@{length}", True), abs=5e-5), multiple
    for (multiple, sd), length in zip(spread.SEED_SD_ACCURACY, (64, 128, 256)):
        assert sd == pytest.approx(pooled(f"tasks/flip_flop/accuracy@{length}", False), abs=5e-5), multiple


def test_report_md_says_why_there_is_no_best_once_per_row(tmp_path: Path):
    """Issue 53: report.md's "best" row repeated "1 seed per group: no intervals, no verdict" in every cell."""
    root = base_sweep(tmp_path / "r", {"10000": [2.74], "100000": [2.75]})
    compare([root], metric="val/ppl")
    rows = [line for line in (root / "report.md").read_text().splitlines() if line.startswith("| best (Welch 95%)")]
    assert rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells.count("1 seed per group: no intervals, no verdict") == 1, row
