"""A new encoding's row placed among the shipped ones, with the code `posenc compare` runs on run
directories: each row becomes a report Group (one Run per seed, its summary the row's values), and
the intervals (Group.stat -> report/stats.aggregate), the ranks with their intervals (pairwise Welch tests)
(report/verdicts.ranking_of) and the verdict against each shipped row (report/verdicts.versus_baseline)
are compare's own. Nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.leaderboard.data import Row
from posenc.report.ranking import Ranking
from posenc.report.runs import Group, Run
from posenc.report.stats import Stat
from posenc.report.verdicts import Versus, ranking_of, versus_baseline


def group_of(row: Row, seeds: Sequence[int]) -> Group:
    """The row as compare sees a sweep's group: one completed run per seed (a seed whose run failed
    has no value of any metric, and is a failed run)."""
    runs = []
    for i, seed in enumerate(seeds):
        summary = {metric: values[i] for metric, values in row.values.items()}
        if all(v is None for v in summary.values()) and row.errors:
            summary = {"status": "failed"}
        runs.append(Run(Path(row.label), {"seed": seed}, {"seed": str(seed)}, summary))
    return Group((row.label,), row.label, runs)


@dataclass(frozen=True)
class Placement:
    """One metric: every row's mean and interval, the ranking of all rows, and the new row against
    each shipped one (its difference, Welch's 95% interval, the verdict)."""
    metric: str
    stats: dict[str, Stat]
    ranking: Ranking
    versus: dict[str, Versus]


def place(shipped: Sequence[Row], new: Row, metrics: Sequence[str], seeds: Sequence[int]) -> list[Placement]:
    """new among shipped (a shipped row of the same label is replaced: the new one is what was run)."""
    groups = [group_of(r, seeds) for r in shipped if r.label != new.label]
    mine = group_of(new, seeds)
    everyone = [*groups, mine]
    return [Placement(metric, {g.label: g.stat(metric) for g in everyone}, ranking_of(everyone, metric),
                      {g.label: versus_baseline(mine, g, metric) for g in groups})
            for metric in metrics]


def ranking_only(shipped: Sequence[Row], metric: str, seeds: Sequence[int]) -> tuple[dict[str, Stat], Ranking]:
    """The shipped rows alone on one metric: their stats and ranking (the leaderboard page)."""
    groups = [group_of(r, seeds) for r in shipped]
    return {g.label: g.stat(metric) for g in groups}, ranking_of(groups, metric)
