"""How far seeds move a metric: the floor of a figure's y-range where groups have one seed.

A group with one seed has no interval, and an axis zoomed on the differences between such groups
turns seed noise into what looks like a result (three RoPE bases within 0.3% filled a whole plot).
So a figure's y-range holds every point ± SPAN_SDS standard deviations of the seed-to-seed spread:
a gap smaller than the noise stays small on the page. The spread comes from the compared runs
themselves where some group has two seeds or more (the pooled within-group sd, on the metric's
scale), else from the spread measured on the shipped leaderboard baselines
(``posenc/leaderboard/baselines/posenc-pe-v2.json``: 3 seeds of each of 20 encodings, the micro model,
T=64; the sd over seeds pooled over encodings, docs/statistics.md; tests/test_plots.py recomputes
these numbers from the file).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posenc.record.metrics import EXTRAPOLATION_PPL, TASK_ACCURACY, VAL_LOSS, VAL_PPL
from posenc.report.stats import scale_of

#: where the shipped spreads come from (said in a figure's title and in docs/statistics.md)
MEASURED = "the leaderboard baselines' seeds"
#: the sd over seeds of ln(perplexity) at each multiple of the training length, pooled over
#: posenc-pe-v2's encodings (3 seeds each: the root mean square of their sds); at 1× it is also the
#: sd of the loss in nats. RoPE's own: 0.0013, 0.050, 0.13 (its 1× is steadier, its 16× less so)
SEED_SD_LOG_PPL: tuple[tuple[float, float], ...] = ((1, 0.0114), (4, 0.0257), (16, 0.0619))
#: the sd over seeds of flip-flop exact match (a fraction) at 2×, 4× and 8×, pooled the same way
SEED_SD_ACCURACY: tuple[tuple[float, float], ...] = ((2, 0.0423), (4, 0.0928), (8, 0.0848))
#: a one-seed point keeps ± this many sds of the spread inside the axis (a seed's 95% range)
SPAN_SDS = 2.0


@dataclass(frozen=True)
class Spread:
    """The sd over seeds of a metric on its own scale (log for perplexity-like), and whose it is."""
    sd: float
    log: bool
    source: str                  # "these runs' seeds" or MEASURED
    low: float | None = None     # the values the metric can take (a loss >= 0, an accuracy in [0, 1])
    high: float | None = None

    def bounds(self, value: float) -> tuple[float, float]:
        """value ± SPAN_SDS·sd on the metric's scale, within the values the metric can take."""
        half = SPAN_SDS * self.sd
        if self.log:
            return value * math.exp(-half), value * math.exp(half)
        low = value - half if self.low is None else max(self.low, value - half)
        return low, value + half if self.high is None else min(self.high, value + half)

    def describe(self, where: str = "") -> str:
        """'axis holds each point ±2 sd of seed noise (sd 1.1%; the leaderboard baselines' seeds)'."""
        size = f"{self.sd:.1%}" if self.log else f"{self.sd:.3g}"
        return f"axis holds each point ±{SPAN_SDS:g} sd of seed noise (sd {size}{where}; {self.source})"


def interpolated(table: tuple[tuple[float, float], ...], multiple: float) -> float:
    """A measured sd at a multiple of the training length, interpolated in log2(multiple) between
    the measured multiples and held constant beyond them."""
    xs = [math.log2(m) for m, _ in table]
    return float(np.interp(math.log2(max(multiple, 1e-9)), xs, [sd for _, sd in table]))


def measured(metric: str, multiple: float | None = None) -> Spread | None:
    """The shipped spread of a metric: val/loss (nats), val/ppl and extrapolation/ppl@L (ln ppl at L's
    multiple of the training length), task accuracies; None for any other metric."""
    scale = scale_of(metric)
    if metric == VAL_LOSS.name:
        return Spread(interpolated(SEED_SD_LOG_PPL, 1), False, MEASURED, scale.low, scale.high)
    if metric == VAL_PPL.name or EXTRAPOLATION_PPL.match(metric):
        return Spread(interpolated(SEED_SD_LOG_PPL, multiple or 1), True, MEASURED)
    if TASK_ACCURACY.match(metric):
        return Spread(interpolated(SEED_SD_ACCURACY, multiple or 1), False, MEASURED, scale.low, scale.high)
    return None


def pooled(metric: str, per_group: Sequence[Sequence[float | None]]) -> Spread | None:
    """The pooled within-group sd of the groups with two seeds or more (on the metric's scale), or
    None where no group has two."""
    scale = scale_of(metric)
    log = scale.log
    variances, weights = [], []
    for values in per_group:
        xs = [math.log(v) if log else v for v in values if v is not None and (v > 0 or not log)]
        if len(xs) > 1:
            variances.append(float(np.var(xs, ddof=1)))
            weights.append(len(xs) - 1)
    if not weights:
        return None
    return Spread(math.sqrt(float(np.average(variances, weights=weights))), log, "these runs' seeds", scale.low,
                  scale.high)


def seed_spread(metric: str, per_group: Sequence[Sequence[float | None]], multiple: float | None = None) -> Spread | None:
    """The runs' own spread where some group has seeds, else the measured one (None: unknown)."""
    return pooled(metric, per_group) or measured(metric, multiple)


def hold_spread(ax, values: Sequence[float], spreads: Sequence[Spread], axis: str = "y") -> None:
    """Widen ax's limits on axis (never narrow them) so each value ± its spread lies inside."""
    lows, highs = zip(*(s.bounds(v) for v, s in zip(values, spreads))) if values else ((), ())
    if not lows:
        return
    get, set_ = (ax.get_ylim, ax.set_ylim) if axis == "y" else (ax.get_xlim, ax.set_xlim)
    low, high = get()
    set_(min(low, *lows), max(high, *highs))
