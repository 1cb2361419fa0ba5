"""The final metric against the swept value (final_<metric>.png): a point per group with its 95%
interval, never a line through them, and the table's verdict marked on it.

A sweep's few values (three RoPE bases) are separate settings, not samples of a curve: a line
through them draws a trend the intervals may not support, so the points stand alone, at their
values on a numeric key (log-x where they span decades) or side by side over categories, and the
groups the verdict names are marked `best` or `tied` as the table says.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.ticker import EngFormatter

from posenc.display.figures import legend_below
from posenc.record.metrics import EXTRAPOLATION_PPL, lookup
from posenc.report.plots import interval_note, plt, save_figure, seeds_note, spread_of, titled, with_note
from posenc.report.ranking import Leader
from posenc.report.runs import Group, format_value
from posenc.report.spread import hold_spread
from posenc.report.stats import Stat
from posenc.report.style import group_families, styles_for


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




def _unit(metric: str) -> str:
    """' (nats/token)': the declared unit of a metric, for an axis label."""
    declared = lookup(metric)
    return f" ({declared.unit})" if declared is not None and declared.unit else ""
