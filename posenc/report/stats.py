"""Statistics a reviewer accepts, computed by scipy.stats: a group's mean over seeds with its 95%
t-interval, and a group's difference to another with Welch's interval and a verdict.

Each metric is averaged on its own scale (its declaration in posenc.record.metrics). Perplexity,
token counts and rates are positive and multiplicative (perplexity = e^loss): their interval is
the t-interval of the mean *log* (for perplexity: of the loss), mapped back with exp, so it is
never negative and is the same interval whether a table shows the loss or the perplexity; the
centre is then the geometric mean e^(mean log x) (the perplexity of the mean loss). Other
metrics get the t-interval of the plain mean, clipped to the values the metric can take (a loss
is never below 0, an accuracy stays in [0, 1]). Two groups are compared on the same scale (a
difference of log perplexities is a ratio of perplexities).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posenc.record.metrics import lookup

CONFIDENCE = 0.95
NO_ERROR_BARS = "1 seed: no error bars"
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference at this n"


@dataclass(frozen=True)
class Scale:
    """How a metric's seeds are averaged: on the log (positive, multiplicative metrics) or as they
    are, and the range an interval is clipped to."""
    log: bool = False
    low: float | None = None
    high: float | None = None


def scale_of(key: str) -> Scale:
    """A summary key's scale from its declaration; an undeclared key is linear and unbounded."""
    metric = lookup(key)
    if metric is None:
        return Scale()
    return Scale(metric.scale == "log", *metric.bounds)


@dataclass(frozen=True)
class Stat:
    """A metric over a group's completed seeds: the values (seed order, None where a seed has
    none), their mean (geometric on a log scale) and 95% interval; no mean when some seed lacks a
    value (averaging only the lucky seeds would flatter the group), no interval for one seed."""
    values: tuple[float | None, ...]
    mean: float | None
    std: float | None          # sample standard deviation (n - 1) of the values as they are
    low: float | None = None
    high: float | None = None
    log: bool = False
    span: float | None = None  # the width of the values the metric can take, where bounded both ways (accuracy: 1)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def reached(self) -> int:
        """How many seeds have a value."""
        return sum(v is not None for v in self.values)

    @property
    def says_nothing(self) -> bool:
        """An interval wider than the value it bounds (high - low > |mean|: the seeds cannot tell the
        mean from half or twice it; two seeds: t₀.₉₇₅,₁ = 12.7 times their standard error), or, for a
        metric bounded both ways (accuracy), wider than half its range. Text prints the seeds'
        values instead of such an interval (report/tables.py)."""
        if self.low is None or self.high is None or self.mean is None:
            return False
        return self.high - self.low > (self.span / 2 if self.span is not None else abs(self.mean))

    @property
    def errors(self) -> tuple[float, float]:
        """(mean - low, high - mean) for an error bar (asymmetric on a log scale); 0 without one."""
        if self.mean is None or self.low is None or self.high is None:
            return 0.0, 0.0
        return self.mean - self.low, self.high - self.mean


def _clean(values: Sequence[float | None]) -> tuple[float | None, ...]:
    return tuple(None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values)


def on_scale(values: Sequence[float], scale: Scale) -> tuple[np.ndarray, bool]:
    """The values where means and differences are taken: their log on a log scale (falling back
    to the values themselves if one is not positive), and whether that was the log."""
    x = np.asarray(values, dtype=float)
    log = scale.log and bool(np.all(x > 0))
    return (np.log(x) if log else x), log


def aggregate(values: Sequence[float | None], scale: Scale = Scale(), confidence: float = CONFIDENCE) -> Stat:
    """The group's Stat: mean ± t_{(1+c)/2, n-1}·s/√n on the metric's scale, mapped back and clipped
    to its range (every table and figure of a report takes its intervals from here)."""
    cleaned = _clean(values)
    present = [v for v in cleaned if v is not None]
    if not present or len(present) < len(cleaned):
        return Stat(cleaned, None, None, log=scale.log)
    x, log = on_scale(present, scale)
    if len(present) == 1:
        return Stat(cleaned, present[0], 0.0, log=log)
    back = np.exp if log else (lambda v: v)
    centre, std = float(back(x.mean())), float(np.std(present, ddof=1))
    from scipy import (
        stats,  # here, not at import (2 s): a figure of one run needs no interval
    )

    sem = stats.sem(x)
    low, high = (x.mean(), x.mean()) if sem == 0 else stats.t.interval(confidence, len(x) - 1, loc=x.mean(), scale=sem)
    low, high = float(back(low)), float(back(high))
    if scale.low is not None:
        low = max(low, scale.low)
    if scale.high is not None:
        high = min(high, scale.high)
    span = scale.high - scale.low if scale.low is not None and scale.high is not None else None
    return Stat(cleaned, centre, std, low, high, log, span)


@dataclass(frozen=True)
class Difference:
    """A group against a baseline with Welch's interval: on a linear scale mean(group) -
    mean(baseline); on a log scale the ratio of their geometric means (ratio=True)."""
    diff: float
    low: float | None
    high: float | None
    df: float | None
    verdict: str
    n: int
    n_baseline: int
    ratio: bool = False


def compare_to_baseline(group: Sequence[float], baseline: Sequence[float], higher_is_better: bool,
                        scale: Scale = Scale(), confidence: float = CONFIDENCE) -> Difference:
    """Welch's t-interval (scipy.stats.ttest_ind, unequal variances) for the difference of the
    means on the metric's scale, and a verdict: 'better' / 'worse' when the whole interval lies on
    one side of no difference (read through the metric's direction), else 'no detectable
    difference at this n'; NO_ERROR_BARS when either side has a single seed."""
    group, baseline = [float(v) for v in group], [float(v) for v in baseline]
    if not group or not baseline:
        raise ValueError("compare_to_baseline needs at least one value on each side")
    log = scale.log and min(group + baseline) > 0  # both sides on the same scale: the log only if both allow it
    a, b = (np.log(group), np.log(baseline)) if log else (np.asarray(group), np.asarray(baseline))
    back = math.exp if log else (lambda v: v)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return Difference(back(diff), None, None, None, NO_ERROR_BARS, len(a), len(b), log)
    if a.var() == 0 and b.var() == 0:  # every seed gave the same value on both sides: the difference is exact
        low, high, df = diff, diff, float(len(a) + len(b) - 2)
    else:
        from scipy import stats

        with warnings.catch_warnings():  # nearly equal values: scipy warns of precision loss, the interval stands
            warnings.simplefilter("ignore", RuntimeWarning)
            result = stats.ttest_ind(a, b, equal_var=False)
            low, high = result.confidence_interval(confidence)
        df = float(result.df)
    verdict = NO_DIFFERENCE
    if low > 0 or high < 0:
        verdict = BETTER if (low > 0) == higher_is_better else WORSE
    return Difference(back(diff), float(back(low)), float(back(high)), df, verdict, len(a), len(b), log)


def detectable(group: Sequence[float], other: Sequence[float], scale: Scale = Scale()) -> bool:
    """Whether Welch's 95% interval of the difference excludes none (either direction)."""
    return compare_to_baseline(group, other, True, scale).verdict in (BETTER, WORSE)
