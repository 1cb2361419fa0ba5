"""The position bins of the per-position loss (posenc/eval/per_position.py), which every evaluation
length shares, and the loss in them over the windows scored: the pooled mean and the spread
across windows, the band of its figure.

Log-spaced, so each doubling of the position gets as many bins as the next (equal widths on the
figure's log axis): each position alone at the start, where the loss falls fastest, then
``BINS_PER_DOUBLING`` bins per doubling. The same edges at every length make a bin the same
positions at 1× and at 16×, so two lengths' curves compare point by point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

BINS_PER_DOUBLING = 2  # past the single positions at the start (0–3): bins ~41% of their position wide


def position_bins(longest: int, lengths: Sequence[int] = (), per_doubling: int = BINS_PER_DOUBLING) -> np.ndarray:
    """Edges 0 = e_0 < e_1 < … = longest of the position bins every evaluation length shares: at
    round(2^(k/per_doubling)), so each position is a bin of its own while those are closer than one
    apart (0…3 for 2 per doubling) and there are per_doubling bins per doubling after; every length
    is an edge too, so no bin runs past the end of a shorter window."""
    k = np.arange(0, per_doubling * math.log2(max(longest, 1)) + 1)
    edges = np.concatenate([[0], np.round(2.0 ** (k / per_doubling)), list(lengths), [longest]]).astype(np.int64)
    edges = np.unique(edges)
    return edges[edges <= longest]


def describe_bins(edges: Sequence[int]) -> str:
    """How the bins are cut, for a figure: 'positions 0–7 one by one, then 4 bins per doubling'."""
    widths = np.diff(np.asarray(edges))
    single = int(np.argmax(widths > 1)) if (widths > 1).any() else len(widths)
    if single == len(widths):
        return "every position its own bin"
    return f"positions 0–{single - 1} one by one, then {BINS_PER_DOUBLING} bins per doubling"


@dataclass
class BinStats:
    """Per position bin, over the windows scored: the summed loss and its targets (the pooled
    mean, every target weighted alike), and each window's own mean in the bin summed and squared
    (the spread across windows: the band)."""

    edges: np.ndarray
    total: np.ndarray = field(init=False)       # (bins,) summed loss, float64
    count: np.ndarray = field(init=False)       # (bins,) targets
    window_sum: np.ndarray = field(init=False)  # (bins,) Σ over windows of the window's mean in the bin
    window_sq: np.ndarray = field(init=False)   # (bins,) Σ of its square
    windows: np.ndarray = field(init=False)     # (bins,) windows with a target in the bin

    def __post_init__(self) -> None:
        n = len(self.edges) - 1
        self.total, self.window_sum, self.window_sq = np.zeros(n), np.zeros(n), np.zeros(n)
        self.count, self.windows = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)

    def add(self, loss: np.ndarray, scored: np.ndarray, positions: np.ndarray) -> None:
        """loss (b, L) float64 (0 where not scored), scored (b, L) bool, positions (b, L) of each
        target: into each window's bins, then the bins' sums."""
        b, n = loss.shape[0], len(self.edges) - 1
        bins = np.searchsorted(self.edges, positions, side="right") - 1  # (b, L) bin of each position
        flat = (np.arange(b)[:, None] * n + bins).ravel()  # (b·L,) one slot per (window, bin)
        sums = np.bincount(flat, weights=(loss * scored).ravel(), minlength=b * n).reshape(b, n)
        counts = np.bincount(flat, weights=scored.ravel(), minlength=b * n).reshape(b, n)
        self.total += sums.sum(0)
        self.count += counts.sum(0).astype(np.int64)
        has = counts > 0
        means = np.divide(sums, counts, out=np.zeros_like(sums), where=has)  # (b, bins) each window's mean
        self.window_sum += means.sum(0)
        self.window_sq += (means**2).sum(0)
        self.windows += has.sum(0)

    def curve(self, upto: int) -> dict:
        """The bins below position ``upto`` as parallel lists: start, end (exclusive), loss (the pooled
        mean; None without a target), count (targets), windows_in_bin (windows with a target there), and
        low/high, the 95% t-interval of the mean of those windows' means (None from fewer than two)."""
        from scipy import stats  # start-up: only once a curve is recorded

        n = int(np.searchsorted(self.edges, upto))  # upto is an edge: the bins below it
        out: dict[str, list] = {"start": self.edges[:n].tolist(), "end": self.edges[1 : n + 1].tolist(),
                                "loss": [], "count": self.count[:n].tolist(), "low": [], "high": [],
                                "windows_in_bin": self.windows[:n].tolist()}
        for i in range(n):
            w = int(self.windows[i])
            out["loss"].append(float(self.total[i] / self.count[i]) if self.count[i] else None)
            if w < 2:
                out["low"].append(None)
                out["high"].append(None)
                continue
            mean = self.window_sum[i] / w
            sd = math.sqrt(max(0.0, (self.window_sq[i] - w * mean * mean) / (w - 1)))
            half = float(stats.t.ppf(0.975, w - 1)) * sd / math.sqrt(w)
            out["low"].append(max(0.0, float(mean - half)))  # a loss is never negative
            out["high"].append(float(mean + half))
        return out
