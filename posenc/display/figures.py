"""Every PNG posenc writes goes through here: matplotlib's Agg backend (no display needed), one
resolution, a bounding box that grows to hold a legend outside the axes, and an atomic write
(a stopped run never leaves half a figure). ``legend_below`` is the one legend placement: under
the axes, in as many columns as fit their width, so it covers no data and adds no empty column."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

DPI = 150


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use (startup stays fast)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend_below(axes: Sequence, title: str | None = None, fontsize: float = 8):
    """One legend for the entries of all ``axes`` (a label once), centred under them, its rows as
    wide as their content: as many columns as fit within the axes' width (labels included), so
    a short legend is one line and a long one wraps instead of widening the figure. ``title``
    only where it says something (e.g. what a shaded band is). Call it once the layout is final
    (after tight_layout): it measures the drawn axes. Returns the Legend, or None without entries."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if not entries:
        return None
    fig = axes[0].figure
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in axes]  # display pixels, tick and axis labels included
    left, right, bottom = min(b.x0 for b in boxes), max(b.x1 for b in boxes), min(b.y0 for b in boxes)
    anchor = ((left + right) / 2 / fig.bbox.width, bottom / fig.bbox.height)  # figure fraction

    def place(ncol: int):
        return fig.legend(list(entries.values()), list(entries), loc="upper center", bbox_to_anchor=anchor,
                          ncol=ncol, title=title, fontsize=fontsize, title_fontsize=fontsize, frameon=False,
                          borderaxespad=0.3, columnspacing=1.5)

    ncol = len(entries)
    legend = place(ncol)
    while ncol > 1 and legend.get_window_extent(renderer).width > right - left:  # the fewest rows that fit
        legend.remove()
        ncol -= 1
        legend = place(ncol)
    rows = -(-len(entries) // ncol)
    if -(-len(entries) // rows) < ncol:  # the same rows, balanced: 3 + 3, not 5 + 1
        legend.remove()
        legend = place(-(-len(entries) // rows))
    return legend


def log2_positions(ax, longest: int, train_length: int | None = None) -> None:
    """A position axis 0..longest on a log-2 scale (symlog, linear below 1 so position 0 is on
    it): each doubling of the context gets the same width, so the positions up to the training
    length are not squeezed into the first 1/16 of a 16x figure. Ticked at 0, the training length
    (its label bold) and powers of two, every k-th one where the axes are too narrow for all."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("symlog", base=2, linthresh=1, linscale=0.5)
    ax.set_xlim(-0.2, longest)
    powers = [2**k for k in range(int(math.log2(max(longest, 1))) + 1)]
    inches = ax.get_position().width * ax.figure.get_figwidth()
    step = math.ceil(len(powers) / max(3, int(inches / 0.3)))  # room for a label like "1024" per tick
    powers = powers[::-step][::-1]  # the longest window always ticked
    if train_length:  # no label crowding the training length's
        powers = [p for p in powers if abs(math.log2(p / train_length)) >= step or p == train_length]
    ticks = sorted({0, *powers, *([train_length] if train_length else [])})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(t) for t in ticks])
    for tick, label in zip(ticks, ax.get_xticklabels()):
        if tick == train_length:
            label.set_fontweight("bold")


def save_figure(fig, path: str | Path) -> Path:
    """The figure as a PNG at path (its folder made), then closed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    pyplot().close(fig)
    tmp.replace(path)
    return path
