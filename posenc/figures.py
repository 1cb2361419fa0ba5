"""Every PNG posenc writes goes through here: matplotlib's Agg backend (no display needed), one
resolution, a bounding box that grows to hold a legend outside the axes, and an atomic write
(a stopped run never leaves half a figure)."""

from __future__ import annotations

from pathlib import Path

DPI = 150


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use (startup stays fast)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """The figure as a PNG at path (its folder made), then closed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    pyplot().close(fig)
    tmp.replace(path)
    return path
