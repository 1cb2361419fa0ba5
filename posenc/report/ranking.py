"""How sure is a ranking? The leader (best only where detectable), each group's rank with an
interval from the same pairwise tests, and whether a ranking holds across another key (Kendall's τ
and the flips).

Plain functions over plain data — {group label: per-seed values} — returning dataclasses, so a
script can build a README table from them without the report:

    ranking = rank_groups({"rope": [9.8, 12.1], "alibi": [8.0, 8.3]}, higher_is_better=False, log=True)
    ranking.ranks[0].label, ranking.ranks[0].low, ranking.ranks[0].high, ranking.leader.best

Rank intervals come from the pairwise Welch tests the verdict uses (the "pairwise comparison"
confidence set for ranks of Klein, Wright & Wieczorek, 2020, without their multiplicity correction):
a group's best possible rank is 1 + the number of groups detectably ahead of it, its worst the
number of groups minus those detectably behind it. So the ranks and the verdict cannot disagree:
the leader's interval is [1, 1] exactly when it is named best, and every group tied for best has an
interval starting at 1. A group with one seed is detectably different from none ([1, n groups]).
A bootstrap of 2-3 seeds, as used before, sees only a few distinct means and printed [1, 1] beside
a tie. Kendall's τ between rankings keeps Efron's bootstrap (seeds resampled in every cell, by
scipy.stats.bootstrap with a seeded numpy Generator: deterministic).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from posenc.report.stats import detectable

RESAMPLES = 1000


@dataclass(frozen=True)
class Leader:
    """The best group where the data can tell: `best` is ahead of every other group by a
    detectable margin (Welch 95% on the metric's scale); otherwise best is None and `tied` holds
    the leading group and every group not detectably behind it."""
    best: str | None
    tied: tuple[str, ...]
    reason: str = ""        # why there is no verdict at all (one seed, a single group)


@dataclass(frozen=True)
class Rank:
    label: str
    rank: float             # of the group's mean among the groups, 1 = best (ties share the average rank)
    low: float              # 1 + the groups detectably ahead (Welch 95%)
    high: float             # the groups' count - the groups detectably behind
    n: int                  # seeds
    mean: float             # on the metric's own scale (the geometric mean on a log scale)


@dataclass(frozen=True)
class Ranking:
    ranks: list[Rank]       # best first
    leader: Leader
    unranked: list[str]     # groups without a mean (a seed lacks the value, or none finished)


@dataclass(frozen=True)
class Flip:
    """Two groups in the opposite order at two values of the key: `first` ahead at u, `second` at v."""
    first: str
    second: str
    confident: bool         # both orders are detectable differences; else within noise


@dataclass(frozen=True)
class Agreement:
    """Kendall's τ between the rankings at two values u, v of a key, over the groups both rank."""
    u: str
    v: str
    tau: float | None       # None: fewer than two shared groups, or a ranking all ties
    low: float | None       # 95% bootstrap interval of τ
    high: float | None
    groups: tuple[str, ...]
    flips: tuple[Flip, ...]


Values = Mapping[str, Sequence[float | None]]


def complete(values: Values) -> tuple[dict[str, np.ndarray], list[str]]:
    """({label: the seeds' values}, [labels some seed of which has no value]): only complete groups rank."""
    full = {k: np.asarray(v, dtype=float) for k, v in values.items() if v and all(x is not None for x in v)}
    return full, [k for k in values if k not in full]


def scaled(values: Values, log: bool) -> tuple[dict[str, np.ndarray], bool]:
    """The complete groups' values where means are taken (their log on a log scale, unless one is
    not positive), and whether that was the log."""
    full, _ = complete(values)
    log = log and all(np.all(x > 0) for x in full.values())
    return {k: np.log(x) if log else x for k, x in full.items()}, log


def behind(x: Mapping[str, np.ndarray], higher_is_better: bool) -> dict[str, set[str]]:
    """{group: the groups detectably ahead of it} by Welch's 95% interval on the values as given (a
    group with one seed is detectably behind or ahead of none)."""
    sign = -1 if higher_is_better else 1
    ahead: dict[str, set[str]] = {k: set() for k in x}
    for a, b in itertools.combinations(x, 2):
        if len(x[a]) > 1 and len(x[b]) > 1 and detectable(x[a], x[b]):
            first, second = (a, b) if sign * x[a].mean() < sign * x[b].mean() else (b, a)
            ahead[second].add(first)
    return ahead


def _leader(x: Mapping[str, np.ndarray], ahead: Mapping[str, set[str]], higher_is_better: bool) -> Leader:
    if len(x) < 2:
        return Leader(None, tuple(x), "a single group: nothing to rank against")
    sign = -1 if higher_is_better else 1
    order = sorted(x, key=lambda k: sign * x[k].mean())
    if all(len(v) < 2 for v in x.values()):
        return Leader(None, tuple(order), "1 seed per group: no intervals, no verdict")
    # tied for best: every group no other is detectably ahead of (the leader always is one)
    tied = [k for k in order if not ahead[k]]
    top = order[0]
    best = top if len(tied) == 1 and all(top in ahead[k] for k in order[1:]) else None
    return Leader(best, tuple(tied))


def leader(values: Values, higher_is_better: bool, log: bool = False) -> Leader:
    """Who is best on this metric, and only where Welch's 95% interval says so."""
    x, _ = scaled(values, log)
    return _leader(x, behind(x, higher_is_better), higher_is_better)


def rank_groups(values: Values, higher_is_better: bool, log: bool = False) -> Ranking:
    """The groups ranked by their mean, each with the interval of ranks the pairwise Welch tests
    allow, and the leader from the same tests."""
    x, logged = scaled(values, log)
    unranked = complete(values)[1]
    ahead = behind(x, higher_is_better)
    lead = _leader(x, ahead, higher_is_better)
    if not x:
        return Ranking([], lead, unranked)
    sign = -1.0 if higher_is_better else 1.0
    labels = list(x)
    point = stats.rankdata([sign * x[k].mean() for k in labels])
    back = np.exp if logged else float
    ranks = []
    for i, k in enumerate(labels):
        below = sum(k in ahead[j] for j in labels)  # groups detectably behind k
        ranks.append(Rank(k, float(point[i]), float(1 + len(ahead[k])), float(len(labels) - below), len(x[k]),
                          float(back(x[k].mean()))))
    ranks.sort(key=lambda r: (r.rank, r.label))
    return Ranking(ranks, lead, unranked)


def _tau(x: np.ndarray, y: np.ndarray) -> float | None:
    with warnings.catch_warnings():  # a ranking of all ties: τ is undefined (nan), said as None
        warnings.simplefilter("ignore")
        tau = stats.kendalltau(x, y).statistic
    return None if np.isnan(tau) else float(tau)


def _tau_interval(at_u: list[np.ndarray], at_v: list[np.ndarray], resamples: int,
                  rng: np.random.Generator) -> tuple[float | None, float | None]:
    """95% percentile interval of τ between the groups' means at u and at v, each group's seeds at
    each value resampled on their own (scipy.stats.bootstrap over the 2·groups samples, unpaired).
    A resample whose ranking is all ties has no τ: it is left out (np.nanpercentile), and an interval
    no resample defines is None. A cell of one seed is resampled as itself."""
    cells = [*at_u, *at_v]
    drawn = [i for i, c in enumerate(cells) if len(c) > 1]  # scipy resamples samples of two or more
    groups = len(at_u)

    def tau_of_means(*resampled: np.ndarray) -> float:
        means = [c.mean() for c in cells]
        for i, c in zip(drawn, resampled):
            means[i] = c.mean()
        t = _tau(np.array(means[:groups]), np.array(means[groups:]))
        return np.nan if t is None else t

    if not drawn:
        taus = np.full(resamples, tau_of_means())
    else:
        with warnings.catch_warnings():  # a degenerate resample distribution warns; its NaNs are handled below
            warnings.simplefilter("ignore")
            taus = stats.bootstrap([cells[i] for i in drawn], tau_of_means, n_resamples=resamples, vectorized=False,
                                   paired=False, method="percentile", random_state=rng).bootstrap_distribution
    if np.isnan(taus).all():
        return None, None
    return float(np.nanpercentile(taus, 2.5)), float(np.nanpercentile(taus, 97.5))


def flips(u: Values, v: Values, shared: Sequence[str], higher_is_better: bool, log: bool = False) -> list[Flip]:
    """The pairs of groups ranked one way at u and the other at v; confident where the difference
    is detectable (Welch 95%) at both."""
    sign = -1 if higher_is_better else 1
    (fu, _), (fv, _) = scaled(u, log), scaled(v, log)
    out = []
    for a, b in itertools.combinations(shared, 2):
        at_u, at_v = sign * (fu[a].mean() - fu[b].mean()), sign * (fv[a].mean() - fv[b].mean())
        if at_u * at_v < 0:
            first, second = (a, b) if at_u < 0 else (b, a)
            confident = all(len(f[a]) > 1 and len(f[b]) > 1 and detectable(f[a], f[b]) for f in (fu, fv))
            out.append(Flip(first, second, confident))
    return out


def rank_agreement(by_value: Mapping[str, Values], higher_is_better: bool, log: bool = False,
                   resamples: int = RESAMPLES, seed: int = 0) -> list[Agreement]:
    """For each pair of values (u, v) of a key: Kendall's τ (scipy.stats.kendalltau) between the
    groups' means at u and at v, its 95% bootstrap interval (seeds resampled in every cell), and
    the pairs whose order flips."""
    rng = np.random.default_rng(seed)
    out = []
    for u, v in itertools.combinations(by_value, 2):
        (fu, _), (fv, _) = scaled(by_value[u], log), scaled(by_value[v], log)
        shared = tuple(k for k in fu if k in fv)
        if len(shared) < 2:
            out.append(Agreement(u, v, None, None, None, shared, ()))
            continue
        tau = _tau(np.array([fu[k].mean() for k in shared]), np.array([fv[k].mean() for k in shared]))
        low, high = _tau_interval([fu[k] for k in shared], [fv[k] for k in shared], resamples, rng)
        found = flips(by_value[u], by_value[v], shared, higher_is_better, log)
        out.append(Agreement(u, v, tau, low, high, shared, tuple(found)))
    return out
