"""Rank against another key (--within): does the encoding ranking hold across model size, recipe
or budget? One line per group, its rank at each value of the key, the rank
interval (pairwise Welch 95%) as a bar (report/ranking.py); rank 1 at the top."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from posenc.display.figures import legend_below
from posenc.report.plots import save_figure, titled
from posenc.report.ranking import Ranking
from posenc.report.style import styles_for

BARS = "rank, interval from pairwise Welch 95% tests"


def plot_ranks(rankings: Mapping[str, Ranking], within: str, metric: str, out: Path, title: str,
               setup: str = "", by: str | None = None) -> Path:
    """x: the key's values in order (categorical, as the tables list them); y: rank (1 = best, on
    top). Lines are nudged sideways a little so overlapping bars stay readable; the legend lists
    the groups by their keys (by)."""
    values = list(rankings)
    labels = sorted({r.label for ranking in rankings.values() for r in ranking.ranks})
    styles = styles_for(labels)
    fig, ax = plt.subplots(figsize=(8, 4.6))
    nudge = np.linspace(-0.12, 0.12, len(labels)) if len(labels) > 1 else np.zeros(1)
    for offset, label in zip(nudge, labels):
        points = [(i, r) for i, v in enumerate(values) for r in rankings[v].ranks if r.label == label]
        if not points:
            continue
        x = np.array([i for i, _ in points]) + offset
        y = np.array([r.rank for _, r in points])
        bars = [[r.rank - r.low for _, r in points], [r.high - r.rank for _, r in points]]
        ax.errorbar(x, y, yerr=bars, capsize=3, markersize=6, linewidth=1.4, label=label, **styles[label].line())
    most = max((len(r.ranks) for r in rankings.values()), default=1)
    ax.set_xticks(range(len(values)), values)
    ax.set_xlim(-0.5, len(values) - 0.5)
    ax.set_yticks(range(1, most + 1))
    ax.set_ylim(most + 0.5, 0.5)  # rank 1 on top
    ax.set_xlabel(within)
    ax.set_ylabel(f"rank by {metric} (1 = best)")
    titled(ax, title, setup)
    ax.grid(alpha=0.3, axis="y")
    seeds = any(r.n > 1 for ranking in rankings.values() for r in ranking.ranks)  # one seed each: no bars to name
    legend_below([ax], " · ".join(filter(None, [by, BARS if seeds else None])) or None)
    return save_figure(fig, out)
