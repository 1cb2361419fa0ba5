"""The comparison's figures, as PNG files (matplotlib, Agg: no display needed).

Every figure has labelled axes with units, a legend under the axes (it never covers a line and
adds no empty column: posenc/display/figures.py), a title that states the setup (model, T, tokens,
seeds), and one look per group that is the same in every figure (report/style.py). A group's
line is the mean over its completed seeds; the band (or error bar) is its 95% interval, the one
the tables print (report/stats.py: on the log scale for perplexity-like metrics, so never below
zero). The legend's title says so only when some group has an interval to draw (two seeds or more).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from posenc.display.figures import legend_below, pyplot, save_figure

plt = pyplot()  # Agg, before anything else imports pyplot
import numpy as np  # noqa: E402
from matplotlib.ticker import EngFormatter, FormatStrFormatter, LogLocator, NullLocator  # noqa: E402

from posenc.record.metrics import EXTRAPOLATION_PPL, TOKENS, Target, lookup  # noqa: E402
from posenc.report.ranking import Leader  # noqa: E402
from posenc.report.runs import Group, format_value  # noqa: E402
from posenc.report.spread import Spread, hold_spread, seed_spread  # noqa: E402
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
    # evaluation stays on the chart (issue 47: a zoom from the second one down hid the first), on a
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


def _long(labels: Sequence[str]) -> bool:
    """Whether category labels would run into each other side by side on a figure's x-axis."""
    return sum(len(label) for label in labels) > 70 or max((len(label) for label in labels), default=0) > 14


def _final_over_numbers(ax, stats: list[tuple[Group, Stat]], by: Sequence[str], i: int) -> dict[str, tuple]:
    """A point per group at its value of the numeric key by[i] (log-x when it spans decades, e.g.
    RoPE's base), the interval as error bars, one colour and marker per combination of the other
    keys, nudged apart so their bars do not overlap. No line joins the points: a sweep's few values
    are separate settings, and a line through them would draw a trend the intervals may not support.
    Returns each group's (x, y) for marks."""
    series: dict[tuple, list] = {}
    for g, s in stats:
        series.setdefault(g.key[:i] + g.key[i + 1:], []).append((g.key[i], s, g.label))
    rest_keys = [k for j, k in enumerate(by) if j != i]
    series_styles = styles_for([", ".join(format_value(v) for v in rest) for rest in series])
    own = styles_for([g.label for g, _ in stats], group_families([g for g, _ in stats])) if len(series) == 1 else {}
    xs = [g.key[i] for g, _ in stats]
    log_x = min(xs) > 0 and max(xs) / min(xs) >= 100
    where = {}
    for j, (rest, points) in enumerate(series.items()):
        nudge = (j - (len(series) - 1) / 2) * 0.06  # in decades on a log axis, in units of the step otherwise
        label = ", ".join(f"{k}={format_value(v)}" for k, v in zip(rest_keys, rest))
        for x, st, group in sorted(points, key=lambda p: p[0]):
            # one series: each point in its group's look, as in the report's other figures
            style = own.get(group) or series_styles[", ".join(format_value(v) for v in rest)]
            xn = x * 10**nudge if log_x else x + nudge * (max(xs) - min(xs) or 1) / max(1, len(set(xs)) - 1)
            err = {"yerr": [[e] for e in st.errors]} if st.low is not None else {}  # one seed: none
            ax.errorbar([xn], [st.mean], fmt=style.marker, markersize=8, capsize=5, color=style.color,
                        markerfacecolor="none", markeredgewidth=1.6, label=label or None, **err)
            where[group] = (xn, st.high if st.high is not None else st.mean)
    if log_x:
        ax.set_xscale("log")
        ax.set_xticks(sorted(set(xs)), [format_value(x) for x in sorted(set(xs))])  # the swept values, not 10^k
        ax.minorticks_off()
        ax.set_xlim(min(xs) / 10**0.5, max(xs) * 10**0.5)
    else:
        ax.xaxis.set_major_formatter(EngFormatter())
        span = (max(xs) - min(xs)) or 1.0
        ax.set_xlim(min(xs) - 0.25 * span / max(1, len(set(xs)) - 1), max(xs) + 0.25 * span / max(1, len(set(xs)) - 1))
    ax.set_xlabel(by[i] + (" (log scale)" if log_x else ""))
    if len(series) > 1:
        legend_below([ax], title=", ".join(rest_keys))
    return where


def _final_over_categories(ax, stats: list[tuple[Group, Stat]], by: Sequence[str]) -> dict[str, tuple]:
    """A point per group, not a bar: the axis is zoomed on the differences, and a bar would imply
    zero. Long labels go down the y-axis, horizontal, where they cannot collide. Returns each
    group's (x, y) for marks."""
    styles = styles_for([g.label for g, _ in stats], group_families([g for g, _ in stats]))
    labels = [g.label for g, _ in stats]
    across = not _long(labels)
    where = {}
    for j, (g, st) in enumerate(stats):
        style = styles[g.label]
        x, y = ([j], [st.mean]) if across else ([st.mean], [j])
        err = {"yerr" if across else "xerr": [[e] for e in st.errors]} if st.low is not None else {}  # one seed: none
        ax.errorbar(x, y, fmt=style.marker, markersize=8, capsize=5, color=style.color, markerfacecolor="none",
                    markeredgewidth=1.6, **err)
        top = st.high if st.high is not None else st.mean
        where[g.label] = (j, top) if across else (top, j)
    if across:
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlim(-0.5, len(stats) - 0.5)
        ax.set_xlabel(", ".join(by) or "runs")
    else:
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(len(stats) - 0.5, -0.5)  # the first group on top, as in the table
        ax.set_ylabel(", ".join(by) or "runs")
    return where


def leader_note(leader: Leader | None) -> str | None:
    """What the table's verdict says, for the figure: 'best: 10 (ahead by a detectable margin)',
    'tied: 10, 1000, 100000 (none detectably ahead of another, Welch 95%)'; None without a verdict."""
    if leader is None or leader.reason:
        return None
    if leader.best is not None:
        return f"best: {leader.best} (ahead of every other group by a detectable margin, Welch 95%)"
    if len(leader.tied) > 1:
        return f"tied: {', '.join(leader.tied)} (no group detectably ahead of these, Welch 95%)"
    return None


def _mark_leader(ax, where: dict[str, tuple], leader: Leader | None, horizontal: bool) -> None:
    """'best' or 'tied' beside the points the table's verdict names."""
    if leader is None or leader.reason:
        return
    marked = [leader.best] if leader.best is not None else list(leader.tied) if len(leader.tied) > 1 else []
    for label in marked:
        if label in where:
            ax.annotate("best" if leader.best is not None else "tied", where[label], xytext=(6, 4) if horizontal else (0, 7),
                        textcoords="offset points", ha="left" if horizontal else "center", va="bottom", fontsize=8,
                        color="black")


def plot_final(groups: Sequence[Group], by: Sequence[str], metric: str, path: Path, title: str,
               setup: str = "", leader: Leader | None = None) -> Path:
    """Final metric against the swept value: points with their intervals (over a numeric key at its
    values, over categories side by side), never joined by a line; the metric on the axis the groups
    are not on; the table's verdict (leader: the best, or the groups tied with it) marked."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    stats = [(g, s) for g in groups if (s := g.stat(metric)).mean is not None]
    numeric = [i for i, k in enumerate(by) if all(isinstance(g.key[i], float) for g, _ in stats)]
    horizontal = False
    where: dict[str, tuple] = {}
    if stats and numeric:
        where = _final_over_numbers(ax, stats, by, numeric[0])
    elif stats:
        where = _final_over_categories(ax, stats, by)
        horizontal = _long([g.label for g, _ in stats])
    (ax.set_xlabel if horizontal else ax.set_ylabel)(f"final {metric}" + _unit(metric))
    counts = [len(g.completed) for g, _ in stats]
    spread = spread_of(metric, [g for g, _ in stats], final_multiple(metric, [g for g, _ in stats])) \
        if any(n == 1 for n in counts) else None
    if spread is not None:  # one seed: the axis never zooms in below what seeds move the metric by
        hold_spread(ax, [st.mean for _, st in stats], [spread] * len(stats), "x" if horizontal else "y")
    _mark_leader(ax, where, leader, horizontal)
    (ax.margins(x=0.12) if horizontal else ax.margins(y=0.12))  # room for the marks above the bars
    note = interval_note(metric, any(s.low is not None for _, s in stats), "point", "bar")
    caveat = "; ".join(filter(None, [leader_note(leader), seeds_note(counts, spread)]))
    titled(ax, with_note(title, note), setup, caveat or None)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def final_multiple(metric: str, groups: Sequence[Group]) -> float | None:
    """extrapolation/ppl@L's multiple of the training length (L / trainer.seq_len), when the groups'
    runs share one training length; None for any other metric."""
    match = EXTRAPOLATION_PPL.match(metric)
    lengths = {r.config.get("trainer.seq_len") for g in groups for r in g.completed}
    if not match or len(lengths) != 1 or not isinstance(length := lengths.pop(), (int, float)):
        return None
    return float(match["length"]) / float(length)


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


def _unit(metric: str) -> str:
    """' (nats/token)': the declared unit of a metric, for an axis label."""
    declared = lookup(metric)
    return f" ({declared.unit})" if declared is not None and declared.unit else ""


