"""The ranking as text: the verdict line, the groups with their rank intervals, and with --within
one ranking per value of the key, Kendall's τ between them and the pairs whose order flips."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc.report.comparison import Comparison
from posenc.report.document import TextTable
from posenc.report.format import format_number
from posenc.report.ranking import Agreement, Rank, Ranking
from posenc.report.tables import format_stat, runs_cell

RANK_NOTE = ("Rank interval: the ranks a group can take given the pairwise Welch 95% tests the verdict uses: "
             "from 1 + the groups detectably ahead of it to the number of groups minus those detectably behind "
             "it. So a tie is never shown as a single rank: [1, 1] means detectably best. A group with 1 seed is "
             "detectably different from none.")
INTERVAL_HEADER = "rank interval (Welch 95%)"


def more_seeds(seeds: Sequence[Any]) -> str:
    """The next step where seeds cannot decide: at least 3 seeds and twice as many as now, the new
    ones the next integers not yet used. From seeds 0,1: 'add seeds: seed=2,3 with the same command
    (seed=0,1,2,3 in all)'."""
    present = sorted({int(s) for s in seeds if isinstance(s, (int, float))})
    total = max(3, 2 * len(present))
    new = [s for s in range(total + (max(present) + 1 if present else 0)) if s not in present][:total - len(present)]
    every = sorted(present + new)
    join = lambda xs: ",".join(map(str, xs))  # noqa: E731
    return f"add seeds: seed={join(new)} with the same command (seed={join(every)} in all)"


def verdict(ranking: Ranking | None, metric: str, seeds: Sequence[Any] = ()) -> str:
    """A ranking's answer in one line: the detectable best group, the tied ones, or why none; where
    more seeds could decide (1 seed per group, a tie), the seeds to add."""
    if ranking is None or not ranking.ranks:
        return f"verdict on {metric}: none — no group has {metric} in every seed"
    lead = ranking.leader
    if lead.best is not None:
        return (f"verdict on {metric}: {lead.best} is best, ahead of every other group by a detectable margin "
                "(Welch 95% interval of each difference excludes 0)")
    if lead.reason:
        hint = f" — for intervals and a verdict, {more_seeds(seeds)}" if "1 seed" in lead.reason else ""
        return f"verdict on {metric}: none ({lead.reason}){hint}"
    if len(lead.tied) == 1:  # behind nobody, yet not detectably ahead of everybody (Welch is not transitive)
        return (f"verdict on {metric}: no detectable best — {lead.tied[0]} leads but is not detectably ahead of "
                f"every group — {more_seeds(seeds)}")
    return (f"verdict on {metric}: no detectable best — {', '.join(lead.tied)} tied "
            f"(no group is detectably ahead of any of them, Welch 95%) — {more_seeds(seeds)}")


def verdict_lines(c: Comparison) -> list[str]:
    """The comparison's answer: one line, or with --within one per value of the key."""
    seeds = [s for g in c.groups for s in g.seeds]
    if not c.rankings:
        return [verdict(c.ranking, c.metric, seeds)]
    return [verdict(ranking, f"{c.metric} at {c.within}={value}", seeds) for value, ranking in c.rankings.items()]


def rank_interval(r: Rank, ranking: Ranking) -> str:
    """'[1, 2]'; a group with one seed is flagged (no test can place it), and where every group has
    one seed there is no interval at all."""
    if all(other.n == 1 for other in ranking.ranks):
        return "— (1 seed per group)"
    return f"[{r.low:g}, {r.high:g}]" + (" (1 seed)" if r.n == 1 else "")


def ranking_table(c: Comparison) -> TextTable:
    """The groups best first: rank, seeds, the metric with its interval, the rank interval."""
    assert c.ranking is not None
    by_label = {g.label: g for g in c.groups}
    rows = [[f"{r.rank:g}", r.label, runs_cell(by_label[r.label]), format_stat(by_label[r.label].stat(c.metric), c.metric_fmt),
             rank_interval(r, c.ranking)] for r in c.ranking.ranks]
    rows += [["—", label, runs_cell(by_label[label]), "not in every seed", ""] for label in c.ranking.unranked]
    return TextTable(f"ranking by {c.metric} (1 = best)", ["rank", c.group_header, "n (seeds)",
                     f"{c.metric} [95% interval]", INTERVAL_HEADER], rows, label_column=1)


def within_table(c: Comparison, value: str, ranking: Ranking) -> TextTable:
    rows = [[f"{r.rank:g}", r.label, str(r.n), format_number(r.mean, c.metric_fmt), rank_interval(r, ranking)]
            for r in ranking.ranks]
    rows += [["—", label, "", "not in every seed", ""] for label in ranking.unranked]
    return TextTable(f"{c.within} = {value}: ranking by {c.metric} (1 = best)",
                     ["rank", c.group_header, "n (seeds)", c.metric, INTERVAL_HEADER], rows, label_column=1)


def _tau(a: Agreement) -> str:
    if a.tau is None:
        return "— (fewer than 2 groups ranked at both)"
    return f"{a.tau:+.2f}" + (f" [{a.low:+.2f}, {a.high:+.2f}]" if a.low is not None else "")


def agreement_table(c: Comparison) -> TextTable:
    """Kendall's τ between the rankings at each pair of the key's values (1: the same order, -1: reversed)."""
    rows = [[f"{a.u} vs {a.v}", str(len(a.groups)), _tau(a),
             f"{sum(f.confident for f in a.flips)} confident, {sum(not f.confident for f in a.flips)} within noise"]
            for a in c.agreements]
    return TextTable(f"does the ranking by {c.metric} hold across {c.within}? Kendall's τ",
                     [f"{c.within}", "groups", "τ [95% bootstrap]", "pairs whose order flips"], rows)


def flips_table(c: Comparison) -> TextTable:
    rows = [[f"{a.u} vs {a.v}", f"{f.first} ahead of {f.second} at {a.u}", f"{f.second} ahead of {f.first} at {a.v}",
             "confident" if f.confident else "within noise"] for a in c.agreements for f in a.flips]
    return TextTable(f"pairs whose order flips between values of {c.within} (confident: both differences "
                     "detectable, Welch 95%)", [c.within, "one way", "the other way", "flagged"], rows)


def rank_text_tables(c: Comparison) -> list[TextTable]:
    """The ranking, then with --within the per-value rankings, τ and the flips."""
    tables = [ranking_table(c)] if c.ranking is not None and len(c.groups) > 1 else []
    tables += [within_table(c, value, ranking) for value, ranking in c.rankings.items()]
    if c.agreements:
        tables.append(agreement_table(c))
    if any(a.flips for a in c.agreements):
        tables.append(flips_table(c))
    return tables


def rank_note(c: Comparison) -> str:
    return RANK_NOTE
