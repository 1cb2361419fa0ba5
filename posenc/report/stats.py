"""Statistics a reviewer accepts: a mean with its 95% t-interval over seeds, a group's difference
to a baseline with a Welch interval and a verdict, and what a set of runs held fixed.

No scipy: Student's t quantile is computed from its CDF, F(t) = 1 - I_x(ν/2, 1/2)/2 with
x = ν/(ν+t²) (I the regularised incomplete beta, by Lentz's continued fraction, Numerical
Recipes §6.4), inverted by bisection; Welch's ν is fractional, so a table would not do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

NO_ERROR_BARS = "1 seed: no error bars"
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference at this n"


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b), x in [0, 1]."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (df > 0, may be fractional)."""
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (0.5 < p < 1), by bisection on ``t_cdf``."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Summary:
    """A group's mean over n seeds with its t-interval (low, high); None bounds when n = 1."""

    n: int
    mean: float
    std: float | None
    low: float | None
    high: float | None
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    return mean, (math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0)


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """mean ± t_{(1+c)/2, n-1} · s/√n over seeds; a single seed has no interval (flagged)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_interval needs at least one value")
    n = len(values)
    mean, var = _mean_var(values)
    if n == 1:
        return Summary(1, mean, None, None, None, NO_ERROR_BARS)
    half = t_quantile((1 + confidence) / 2, n - 1) * math.sqrt(var / n)
    return Summary(n, mean, math.sqrt(var), mean - half, mean + half)


@dataclass(frozen=True)
class Difference:
    """mean(group) - mean(baseline) with Welch's interval and what it means for the metric."""

    diff: float
    low: float | None
    high: float | None
    df: float | None
    verdict: str
    n: int
    n_baseline: int

    def as_dict(self) -> dict:
        return asdict(self)


def welch_interval(group: Sequence[float], baseline: Sequence[float], confidence: float = 0.95
                   ) -> tuple[float, float, float, float]:
    """(diff, low, high, ν): Welch's interval for the difference of means (unequal variances),
    se² = s₁²/n₁ + s₂²/n₂, ν = se⁴ / Σ (sᵢ²/nᵢ)²/(nᵢ-1) (Welch-Satterthwaite)."""
    (m1, v1), (m2, v2) = _mean_var(group), _mean_var(baseline)
    n1, n2 = len(group), len(baseline)
    a, b = v1 / n1, v2 / n2
    se = math.sqrt(a + b)
    diff = m1 - m2
    if se == 0:  # every seed gave the same value in both groups: the difference is exact
        return diff, diff, diff, float(n1 + n2 - 2)
    df = (a + b) ** 2 / (a * a / (n1 - 1) + b * b / (n2 - 1))
    half = t_quantile((1 + confidence) / 2, df) * se
    return diff, diff - half, diff + half, df


def compare_to_baseline(group: Iterable[float], baseline: Iterable[float], higher_is_better: bool,
                        confidence: float = 0.95) -> Difference:
    """The group's difference to the baseline and a verdict: 'better' / 'worse' when the whole
    interval lies on one side of 0 (read through the metric's direction), else 'no detectable
    difference at this n'; NO_ERROR_BARS when either side has a single seed."""
    group, baseline = [float(v) for v in group], [float(v) for v in baseline]
    if not group or not baseline:
        raise ValueError("compare_to_baseline needs at least one value on each side")
    if len(group) < 2 or len(baseline) < 2:
        diff = _mean_var(group)[0] - _mean_var(baseline)[0]
        return Difference(diff, None, None, None, NO_ERROR_BARS, len(group), len(baseline))
    diff, low, high, df = welch_interval(group, baseline, confidence)
    if low > 0 or high < 0:
        larger = low > 0
        verdict = BETTER if larger == higher_is_better else WORSE
    else:
        verdict = NO_DIFFERENCE
    return Difference(diff, low, high, df, verdict, len(group), len(baseline))


def format_summary(s: Summary, spec: str = ".4g") -> str:
    """'2.31 [2.25, 2.37]' for a table cell, or '2.31 (n=1)' without error bars."""
    if s.low is None:
        return f"{s.mean:{spec}} (n=1)"
    return f"{s.mean:{spec}} [{s.low:{spec}}, {s.high:{spec}}]"


def fixed_and_varied(configs: Sequence[dict]) -> tuple[dict, dict]:
    """What a set of runs held fixed and what varied, from their (nested) configs flattened to
    dotted keys: ({key: the shared value}, {key: sorted distinct values as strings})."""
    flat = [_flatten(c) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    fixed, varied = {}, {}
    for key in keys:
        values = [f.get(key, "<absent>") for f in flat]
        if all(v == values[0] for v in values):
            fixed[key] = values[0]
        else:
            varied[key] = sorted({str(v) for v in values}, key=_numbers_first)
    return fixed, varied


def _numbers_first(text: str) -> tuple:
    """'100' < '1000' < '5e5' < 'alibi': numbers by value, then the rest alphabetically."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
