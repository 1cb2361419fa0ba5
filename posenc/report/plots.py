"""The comparison's figures, as PNG files (matplotlib, Agg: no display needed).

Every figure has labelled axes with units and a legend; a group's line is the mean over its
completed seeds and the shaded band (or error bar) is ±1 sample std.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

from posenc.metrics import TOKENS, TOKENS_TO_LOSS, VAL_LOSS, lookup  # noqa: E402
from posenc.report.runs import Group, aggregate, format_value  # noqa: E402

DPI = 110


def mean_curve(group: Group, metric: str = VAL_LOSS.name) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(tokens, mean, std) of a metric over the group's completed seeds, at the token
    counts every seed evaluated (same eval schedule = same points)."""
    curves = []
    for run in group.completed:
        curves.append({row[TOKENS]: row[metric] for row in run.rows if row.get(metric) is not None})
    if not curves:
        return None
    tokens = sorted(set.intersection(*(set(c) for c in curves)))
    if not tokens:
        return None
    values = np.array([[c[t] for t in tokens] for c in curves])  # (seeds, points)
    std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(tokens))
    return np.array(tokens), values.mean(axis=0), std


def plot_convergence(groups: Sequence[Group], path: Path, title: str, targets: Sequence[float] = ()) -> Path:
    """Validation loss against tokens seen: one line per group, seed spread shaded."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    lowest = np.inf
    for group in groups:
        curve = mean_curve(group)
        if curve is None:
            continue
        tokens, mean, std = curve
        n = len(group.completed)
        line, = ax.plot(tokens, mean, marker="o", markersize=2.5, linewidth=1.6, label=f"{group.label} (n={n})")
        if n > 1:
            ax.fill_between(tokens, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        lowest = min(lowest, float(mean.min()))
    for target in targets:
        if target >= lowest:
            ax.axhline(target, color="grey", linestyle=":", linewidth=0.8)
            ax.annotate(f"target {target:g}", (1, target), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=7, color="grey")
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(f"validation loss ({VAL_LOSS.unit})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    # the first evaluation is far above the rest; zoom on where the groups differ
    top = max((float(c[1][min(1, len(c[1]) - 1)]) for g in groups if (c := mean_curve(g)) is not None), default=None)
    if top is not None and np.isfinite(lowest):
        ax.set_ylim(lowest - 0.05 * (top - lowest), top + 0.1 * (top - lowest))
    ax.legend(title="mean ± 1 std over seeds", fontsize=8, title_fontsize=8)
    return save_figure(fig, path)


def plot_final(groups: Sequence[Group], by: Sequence[str], metric: str, path: Path, title: str) -> Path:
    """Final metric against the swept value: a line over a numeric key (log-x when it spans
    decades, e.g. RoPE's base), bars over categories."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    stats = [(g, aggregate(g.values(metric))) for g in groups]
    stats = [(g, s) for g, s in stats if s.mean is not None]
    numeric = [i for i, k in enumerate(by) if all(isinstance(g.key[i], float) for g, _ in stats)]
    if stats and len(numeric) >= 1:
        i = numeric[0]
        series: dict[tuple, list] = {}
        for g, s in stats:
            series.setdefault(g.key[:i] + g.key[i + 1:], []).append((g.key[i], s.mean, s.std))
        for rest, points in series.items():
            points.sort()
            x, y, e = zip(*points)
            label = ", ".join(f"{k}={format_value(v)}" for k, v in zip([k for j, k in enumerate(by) if j != i], rest))
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=label or None)
        xs = [g.key[i] for g, _ in stats]
        log_x = min(xs) > 0 and max(xs) / min(xs) >= 100
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(by[i] + (" (log scale)" if log_x else ""))
        if len(series) > 1:
            ax.legend(fontsize=8)
    elif stats:
        # points, not bars: the y axis is zoomed on the differences, and a bar would imply zero
        for j, (g, st) in enumerate(stats):
            ax.errorbar([j], [st.mean], yerr=[st.std], fmt="o", markersize=8, capsize=5, color=f"C{j}")
        ax.set_xticks(range(len(stats)), [g.label for g, _ in stats])
        ax.set_xlim(-0.5, len(stats) - 0.5)
        ax.set_xlabel(", ".join(by) or "runs")
    ax.set_ylabel(f"final {metric}" + _unit(metric))
    ax.set_title(f"{title}\n(mean ± 1 std over seeds)", fontsize=11)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_tokens_to_target(groups: Sequence[Group], targets: Sequence[float], path: Path, title: str) -> Path:
    """Tokens to first reach each target validation loss: a cluster of bars per target,
    one bar per group; a group some seed never got there has no bar and says so."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    table = {(g.label, t): aggregate(g.values(TOKENS_TO_LOSS.key(target=t)))
             for g in groups for t in targets}
    targets = [t for t in targets if any(table[(g.label, t)].mean is not None for g in groups)]
    if not targets:
        ax.text(0.5, 0.5, "no group reached any target loss\n(set trainer.convergence_targets higher)",
                ha="center", va="center", transform=ax.transAxes)
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(targets))
    for j, group in enumerate(groups):
        stats = [table[(group.label, t)] for t in targets]
        heights = [s.mean if s.mean is not None else 0.0 for s in stats]
        errors = [s.std if s.std is not None else 0.0 for s in stats]
        offsets = x - 0.4 + width * (j + 0.5)
        ax.bar(offsets, heights, width, yerr=errors, capsize=2, label=group.label, color=f"C{j}")
        for xo, s in zip(offsets, stats):
            if s.mean is None:
                ax.text(xo, 0, " not reached", ha="center", va="bottom", fontsize=7, rotation=90, color=f"C{j}")
    ax.set_xticks(x, [f"{VAL_LOSS.name} ≤ {t:g}" for t in targets])
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(EngFormatter())
    ax.set_ylabel(f"{TOKENS_TO_LOSS.unit} to first reach it (lower = faster)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _unit(metric: str) -> str:
    """' (nats/token)': the declared unit of a metric, for an axis label."""
    declared = lookup(metric)
    return f" ({declared.unit})" if declared is not None and declared.unit else ""


def save_figure(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
