"""Is a group better than the baseline, which group leads, and does a ranking hold across another key?

`--baseline rope`: each group's difference to the baseline group on the headline metric, with
Welch's 95% interval on the metric's scale and a verdict read through its direction
(report/stats.py). Without options: the groups ranked with rank intervals from pairwise Welch tests and the
leader (report/ranking.py). `--within model.flavor`: the groups ranked separately for each value
of another key, and Kendall's τ between those rankings ("does the encoding ranking hold across
model flavours?").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posenc.record.metrics import lookup
from posenc.report.ranking import Agreement, Ranking, rank_agreement, rank_groups
from posenc.report.runs import (
    Group,
    Run,
    check_choice,
    format_value,
    group_runs,
    sort_key,
)
from posenc.report.stats import NO_ERROR_BARS, Difference, compare_to_baseline, scale_of


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
    d = compare_to_baseline(mine, base, higher_is_better(metric), scale_of(metric))
    if len(mine) < 2:
        return Versus(d, NO_ERROR_BARS)
    if len(base) < 2:
        return Versus(d, f"baseline has {NO_ERROR_BARS}")
    return Versus(d, d.verdict)


def baseline_table(groups: Sequence[Group], baseline: Group, metric: str) -> dict[str, Versus]:
    """label -> Versus for every group but the baseline."""
    return {g.label: versus_baseline(g, baseline, metric) for g in groups if g is not baseline}


def values_by_group(groups: Sequence[Group], metric: str) -> dict[str, list]:
    """{label: the metric over the group's completed seeds} for the groups with a completed run."""
    return {g.label: g.values(metric) for g in groups if g.completed}


def ranking_of(groups: Sequence[Group], metric: str, values: dict[str, list] | None = None) -> Ranking:
    """The groups ranked on metric (its own scale and direction), with rank intervals from the pairwise Welch tests;
    values: {label: per-seed values} where the caller already has them."""
    values = values if values is not None else values_by_group(groups, metric)
    return rank_groups(values, higher_is_better(metric), scale_of(metric).log)


def rank_within(runs: Sequence[Run], by: Sequence[str], within: str, metric: str
                ) -> tuple[dict[str, Ranking], list[Agreement]]:
    """For each value of `within` (e.g. each model.flavor): the by-groups of its runs ranked; and
    Kendall's τ with its flips between every pair of values."""
    members: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: sort_key(r.value(within))):  # numbers by value, then names
        members.setdefault(format_value(run.value(within)), []).append(run)
    groups = {value: group_runs(rs, by) for value, rs in members.items()}
    values = {value: values_by_group(gs, metric) for value, gs in groups.items()}
    rankings = {value: ranking_of(gs, metric) for value, gs in groups.items()}
    return rankings, rank_agreement(values, higher_is_better(metric), scale_of(metric).log)
