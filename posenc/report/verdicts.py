"""Is a group better than the baseline, and does a ranking hold across another key?

`--baseline rope`: each group's difference to the baseline group on the headline metric, with
Welch's 95% interval and a verdict read through the metric's direction (report/stats.py).
`--within model.flavor`: the groups ranked separately for each value of another key (issue 18:
"does the encoding ranking hold across model flavours?").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posenc.metrics import lookup
from posenc.report.runs import Group, Run, Stat, aggregate, check_choice, format_value, group_runs
from posenc.report.stats import NO_ERROR_BARS, Difference, compare_to_baseline


def higher_is_better(metric: str) -> bool:
    """From the metric's declaration; an undeclared key reads as lower-is-better (a loss)."""
    declared = lookup(metric)
    return declared is not None and declared.better == "higher"


def find_baseline(groups: Sequence[Group], value: str) -> Group:
    """The group whose label (the --by value, e.g. `rope`) is value, a number as the label
    writes it (10000 is the group labelled 1e4); else one error line listing the labels."""
    labels = [g.label for g in groups]
    try:
        value = value if value in labels else format_value(float(value))
    except ValueError:
        pass
    check_choice("--baseline", value, labels)
    return groups[labels.index(value)]


@dataclass(frozen=True)
class Versus:
    """One group against the baseline: the difference, or why there is none."""
    difference: Difference | None
    verdict: str         # better | worse | no detectable difference at this n, or why there is no verdict


def versus_baseline(group: Group, baseline: Group, metric: str) -> Versus:
    mine, base = group.values(metric), baseline.values(metric)
    for side, values in ((group, mine), (baseline, base)):
        reached = [v for v in values if v is not None]
        if not values:
            return Versus(None, f"{side.label}: no completed run")
        if len(reached) < len(values):
            return Versus(None, f"{side.label}: {len(reached)}/{len(values)} seeds have {metric}, no mean")
    d = compare_to_baseline(mine, base, higher_is_better(metric))
    if len(mine) < 2:
        return Versus(d, NO_ERROR_BARS)
    if len(base) < 2:
        return Versus(d, f"baseline has {NO_ERROR_BARS}")
    return Versus(d, d.verdict)


def baseline_table(groups: Sequence[Group], baseline: Group, metric: str) -> dict[str, Versus]:
    """label -> Versus for every group but the baseline."""
    return {g.label: versus_baseline(g, baseline, metric) for g in groups if g is not baseline}


@dataclass(frozen=True)
class Ranked:
    rank: int | None      # 1 = best; None: no mean (a seed lacks the metric, or none finished)
    group: Group
    stat: Stat


def rank_groups(groups: Sequence[Group], metric: str) -> list[Ranked]:
    """Groups best first by their mean of metric; ties share a rank; groups without a mean last."""
    stats = [(g, aggregate(g.values(metric)) if g.completed else Stat(None, None, 0, 0)) for g in groups]
    sign = -1 if higher_is_better(metric) else 1
    with_mean = sorted((x for x in stats if x[1].mean is not None), key=lambda x: sign * x[1].mean)
    ranked, previous, rank = [], None, 0
    for i, (g, s) in enumerate(with_mean, start=1):
        rank = rank if s.mean == previous else i
        previous = s.mean
        ranked.append(Ranked(rank, g, s))
    return ranked + [Ranked(None, g, s) for g, s in stats if s.mean is None]


def rank_within(runs: Sequence[Run], by: Sequence[str], within: str, metric: str) -> dict[str, list[Ranked]]:
    """For each value of `within` (e.g. each model.flavor): the by-groups of its runs, ranked."""
    values: dict[str, list[Run]] = {}
    for run in runs:
        values.setdefault(format_value(run.value(within)), []).append(run)
    return {value: rank_groups(group_runs(members, by), metric) for value, members in sorted(values.items())}


def same_order(rankings: dict[str, list[Ranked]]) -> bool:
    """Whether every value of the within-key ranks the groups it shares in the same order."""
    orders = [[r.group.label for r in ranked if r.rank is not None] for ranked in rankings.values()]
    shared = set.intersection(*(set(o) for o in orders)) if orders else set()
    return len({tuple(label for label in o if label in shared) for o in orders}) <= 1

