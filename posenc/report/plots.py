"""The comparison's figures, as PNG files (matplotlib, Agg: no display needed).

Every figure has labelled axes with units, a legend under the axes (it never covers a line and
adds no empty column: posenc/display/figures.py), a title that states the setup (model, T, tokens,
seeds), and one look per group that is the same in every figure (report/style.py). A group's
line is the mean over its completed seeds; the band (or error bar) is its 95% interval, the one
the tables print (report/stats.py: on the log scale for perplexity-like metrics, so never below
zero). The legend's title names the swept key, and what the lines and bands are only when some group
has an interval to draw (two seeds or more). The final metric's figure is report/plots_final.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from posenc.display.figures import legend_below, pyplot, save_figure

plt = pyplot()  # Agg, before anything else imports pyplot
import numpy as np  # noqa: E402
from matplotlib.ticker import EngFormatter, FormatStrFormatter, LogLocator, NullLocator  # noqa: E402

from posenc.record.metrics import TOKENS, Target  # noqa: E402
from posenc.report.runs import Group  # noqa: E402
from posenc.report.spread import Spread, seed_spread  # noqa: E402
from posenc.report.stats import Stat, aggregate, scale_of  # noqa: E402
from posenc.report.style import group_families, styles_for  # noqa: E402


def mean_curve(group: Group, metric: str = "val/loss") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(tokens, mean, low, high) of a metric over the group's completed seeds, the 95% interval of
    report/stats.py at each point, at the token counts every seed evaluated (same eval schedule =
    same points); one seed: low = high = mean."""
    curves = []
    for run in group.completed:
        curves.append({row[TOKENS]: row[metric] for row in run.rows if row.get(metric) is not None})
    if not curves:
        return None
    tokens = sorted(set.intersection(*(set(c) for c in curves)))
    if not tokens:
        return None
    values = np.array([[c[t] for t in tokens] for c in curves])  # (seeds, points)
    stats = [aggregate(values[:, j], scale_of(metric)) for j in range(len(tokens))]
    mean = np.array([s.mean for s in stats])
    return (np.array(tokens), mean, np.array([s.mean if s.low is None else s.low for s in stats]),
            np.array([s.mean if s.high is None else s.high for s in stats]))


def titled(ax, title: str, setup: str, caveat: str | None = None) -> None:
    """The figure's question on the first line, its setup (model, T, tokens, seeds) below, and what
    it cannot show (one seed: no intervals) on a third line of its own."""
    ax.set_title("\n".join(part for part in (title, setup, caveat) if part), fontsize=10)


def interval_note(metric: str, shown: bool, point: str = "line", mark: str = "band") -> str | None:
    """What a group's line and its band are, for a legend or title: 'line: geometric mean over
    seeds · band: 95% interval' (geometric on a log-scale metric, as the tables); None when no
    interval is drawn (every group has one seed), where it would describe nothing on the figure."""
    if not shown:
        return None
    mean = "geometric mean" if scale_of(metric).log else "mean"
    return f"{point}: {mean} over seeds · {mark}: 95% interval"


def legend_heading(groups: Sequence[Group], note: str | None = None) -> str | None:
    """A legend's title: what its entries are (the groups' keys, 'encoding.base (n = seeds)') and
    what the lines and bands are where drawn."""
    keys = ", ".join(dict.fromkeys(k for g in groups for k in g.by))
    return " · ".join(filter(None, [f"{keys} (n = seeds)" if keys else None, note])) or None


def with_note(title: str, note: str | None) -> str:
    """'Final val/ppl by encoding (point: … · bar: 95% interval)', or the title alone."""
    return f"{title} ({note})" if note else title


def seeds_note(counts: Sequence[int], spread: Spread | None = None, where: str = "") -> str | None:
    """What the figure cannot show: '1 seed per group: no intervals' (or which groups have one),
    and, where the axis was widened to hold the seed spread, by how much; None when every group
    has seeds, where the intervals drawn say it."""
    single = sum(n == 1 for n in counts)
    if not single:
        return None
    note = "1 seed per group: no intervals" if single == len(counts) else \
        f"{single} of {len(counts)} groups with 1 seed: no interval"
    return f"{note}; {spread.describe(where)}" if spread is not None else note


def line_width(j: int) -> float:
    """The j-th group drawn is thinner than the ones before it, so a line that lies on another
    leaves the one under it showing at its edges."""
    return max(1.0, 2.6 - 0.5 * j)


def markevery(j: int, groups: int, points: int) -> tuple[int, int] | None:
    """Each group's markers on every groups-th point, starting at its own offset: curves that
    coincide still show every group's marker (None: few points, every one marked)."""
    return (j % groups, groups) if groups > 1 and points >= 3 * groups else None


def spread_of(metric: str, groups: Sequence[Group], multiple: float | None = None) -> Spread | None:
    """The seed spread that bounds a figure's zoom on metric (report/spread.py): these groups' own
    seeds where some group has two, else the measured one."""
    return seed_spread(metric, [list(g.stat(metric).values) for g in groups], multiple)


def _drawn_targets(targets: Sequence[Target], lowest: float) -> list[float]:
    """The val/loss targets a convergence figure draws: on its axis (not bpb) and not below every
    group's curve (no group reached them: a line there only stretches the axis)."""
    return [t.value for t in targets if not t.bpb and t.value >= lowest]


def plot_convergence(groups: Sequence[Group], path: Path, title: str, targets: Sequence[Target] = (),
                     setup: str = "") -> Path:
    """Validation loss against tokens seen: one line per group, its 95% interval shaded; the
    targets as dotted lines, labelled inside the axes, whose y range holds every target drawn."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    styles = styles_for([g.label for g in groups], group_families(groups))
    curves = {g.label: c for g in groups if (c := mean_curve(g)) is not None}
    drawn_groups = [g for g in groups if g.label in curves]
    for j, group in enumerate(drawn_groups):
        tokens, mean, low, high = curves[group.label]
        n = len(group.completed)
        style = styles[group.label]
        ax.plot(tokens, mean, markersize=4, linewidth=line_width(j), label=f"{group.label} (n={n})",
                markevery=markevery(j, len(drawn_groups), len(tokens)), **style.line())
        if n > 1:
            ax.fill_between(tokens, low, high, color=style.color, alpha=0.2, linewidth=0)
    lowest = min((float(c[1].min()) for c in curves.values()), default=np.inf)
    drawn = _drawn_targets(targets, lowest)
    for value in drawn:
        ax.axhline(value, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(f"target {value:g}", (1, value), xycoords=("axes fraction", "data"), xytext=(-3, 1),
                    textcoords="offset points", ha="right", va="bottom", fontsize=7, color="grey")
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("validation loss (nats/token)")
    titled(ax, title, setup, seeds_note([len(g.completed) for g in drawn_groups]))
    ax.grid(alpha=0.3)
    # the first evaluations are far above the rest (ln 256 = 5.5 nats at the start on bytes): every
    # evaluation stays on the chart (a zoom from the second one down hid the first), on a
    # log axis so the late evaluations, where the groups differ, keep most of the height
    top = max((float(c[1].max()) for c in curves.values()), default=None)
    if top is not None and np.isfinite(lowest) and top > lowest > 0:
        top = max([top, *drawn])
        ax.set_yscale("log")
        ax.set_ylabel("validation loss (nats/token, log scale)")
        span = np.log(top / lowest)
        ax.set_ylim(lowest * np.exp(-0.04 * span), top * np.exp(0.08 * span))
        ax.yaxis.set_major_locator(LogLocator(10, subs=(1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9)))  # 2, 2.5, 3, …
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(NullLocator())
    legend_below([ax], legend_heading(groups, interval_note("val/loss", any(len(g.completed) > 1 for g in groups
                                                                            if g.label in curves))))
    return save_figure(fig, path)


def plot_tokens_to_target(groups: Sequence[Group], targets: Sequence[Target], path: Path, title: str,
                          setup: str = "") -> Path:
    """Tokens to first reach each target (interpolated between evaluations): a cluster of bars
    per target, one bar per group; a group some seed never got there has no bar and says so."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    styles = styles_for([g.label for g in groups], group_families(groups))
    table: dict[tuple[str, Target], Stat] = {(g.label, t): g.stat(t.tokens_key) for g in groups for t in targets}
    targets = [t for t in targets if any(table[(g.label, t)].mean is not None for g in groups)]
    if not targets:
        ax.text(0.5, 0.5, "no group reached any target\n(give higher --target values)",
                ha="center", va="center", transform=ax.transAxes)
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(targets))
    for j, group in enumerate(groups):
        stats = [table[(group.label, t)] for t in targets]
        heights = [s.mean if s.mean is not None else 0.0 for s in stats]
        errors = np.array([s.errors for s in stats]).T.reshape(2, len(stats))  # (below, above) per bar
        offsets = x - 0.4 + width * (j + 0.5)
        color = styles[group.label].color
        ax.bar(offsets, heights, width, yerr=errors if errors.any() else None, capsize=2, label=group.label,
               color=color)
        for xo, s in zip(offsets, stats):
            if s.mean is None:
                ax.text(xo, 0, " not reached", ha="center", va="bottom", fontsize=7, rotation=90, color=color)
    ax.set_xticks(x, [f"{t.curve_metric.name} ≤ {t.value:g}" for t in targets])
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(EngFormatter())
    ax.set_ylabel("tokens to reach it (lower = faster)")
    shown = any(table[(g.label, t)].low is not None for g in groups for t in targets)
    note = interval_note(targets[0].tokens_key, shown, "bar", "error bar") if targets else None
    titled(ax, with_note(title, note), setup, seeds_note([len(g.completed) for g in groups]))
    ax.grid(axis="y", alpha=0.3)
    legend_below([ax], title=", ".join(dict.fromkeys(k for g in groups for k in g.by)) or None)  # what the colours are
    return save_figure(fig, path)
