"""The comparison as tables of text: cells (mean and 95% interval over seeds), the seeds of each
group, who leads each column (only where detectable), the per-seed values, the cost with the
machine's load, and the baseline differences; rendered alike to the terminal (rich), report.md
and report.html (report/document.py). The ranking tables are in report/rank_tables.py."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group as Lines
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from posenc.record.metrics import (
    EXTRAPOLATION_PPL,
    LOADED_PER_CPU,
    MACHINE_CPUS,
    MACHINE_LOAD,
    TASK_ACCURACY,
    target_of,
)
from posenc.report import kernel_paths
from posenc.report.comparison import Column, Comparison
from posenc.report.document import TextTable
from posenc.report.format import format_number, format_value
from posenc.report.ranking import Leader
from posenc.report.runs import Group, Run
from posenc.report.stats import Stat
from posenc.report.verdicts import Versus, higher_is_better

INTERVAL = "mean [95% interval over seeds]"
EARLY = "≤ first eval"
TOO_FEW = "too few to bound"


def format_stat(stat: Stat, fmt: str) -> str:
    """'2.2000 [1.7032, 2.6968]': the mean over seeds and its 95% interval (report/stats.py); one
    seed: the value alone; '—' where no seed got there, 'k/n seeds' where only some did; an
    interval wider than its mean (Stat.says_nothing) is no number: 'n=2, too few to bound: 1,250 / 1,353'."""
    if stat.mean is None:
        return "—" if stat.reached == 0 else f"{stat.reached}/{stat.n} seeds"
    text = format_number(stat.mean, fmt)
    if stat.low is None:
        return text
    if stat.says_nothing:
        return f"n={stat.n}, {TOO_FEW}: " + " / ".join(format_number(v, fmt) for v in stat.values if v is not None)
    return f"{text} [{format_number(stat.low, fmt)}, {format_number(stat.high, fmt)}]"


def too_few_note(tables: list[TextTable]) -> str | None:
    """What a 'n=3, too few to bound: a / b / c' cell is, where a table has one (else None)."""
    if not any(TOO_FEW in cell for t in tables for row in t.rows for cell in row):
        return None
    return (f"'n=k, {TOO_FEW}: a / b / …': the k seeds' values, in seed order, instead of a mean and interval: their "
            "95% interval would be wider than the mean it bounds (the seeds cannot tell it from half or twice it), "
            "so no number is printed; more seeds narrow it (docs/statistics.md).")


def format_seeds(stat: Stat, fmt: str) -> str:
    """'9.790, 12.090': every seed's value, in seed order ('—' where a seed has none)."""
    return ", ".join("—" if v is None else format_number(v, fmt) for v in stat.values)


def format_difference(v: Versus, fmt: str) -> str:
    """'+0.0123 [-0.0100, +0.0346]': group minus baseline with Welch's 95% interval; on a log scale
    the ratio of the geometric means, '×0.951 [×0.902, ×1.003]'."""
    d = v.difference
    if d is None:
        return "—"
    if d.ratio:
        ratio = lambda x: f"×{x:.3g}"  # noqa: E731
        return ratio(d.diff) + (f" [{ratio(d.low)}, {ratio(d.high)}]" if d.low is not None else "")
    sign = lambda x: ("+" if x >= 0 else "−") + format_number(abs(x), fmt)  # noqa: E731
    return sign(d.diff) + (f" [{sign(d.low)}, {sign(d.high)}]" if d.low is not None else "")


def runs_cell(group: Group) -> str:
    """Completed seeds with their seed values, and how many were left out:
    `3 (0,1,2)`, `2 (0,1; +1 failed, +1 unfinished)`."""
    left_out = [f"+{sum(r.status == s for r in group.failed)} {s}" for s in ("failed", "unfinished")
                if any(r.status == s for r in group.failed)]
    seeds = ",".join(format_value(s) for s in group.seeds)
    inside = "; ".join(p for p in (seeds, ", ".join(left_out)) if p)
    return f"{len(group.completed)}" + (f" ({inside})" if inside else "")


def leader_text(lead: Leader | None, compact: bool) -> str:
    """'rope' where one group is detectably best; 'tied: rope, alibi' where not; why there is no verdict."""
    if lead is None:
        return "—"
    if lead.best is None and lead.reason:
        return "—" if compact else lead.reason
    if lead.best is not None:
        return lead.best
    return "tied" if compact else f"tied: {', '.join(lead.tied)}"


def cell_text(c: Comparison, g: Group, col: Column, seeds: bool) -> str:
    """A cell: mean [interval], or per-seed values; convergence seeds already at the target at the
    first evaluation say so (their token count would only be the first evaluation's)."""
    stat = c.cells[(g.label, col.key)]
    early = c.early.get((g.label, col.key), 0)
    if early:
        return EARLY if early == stat.n else f"{early}/{stat.n} {EARLY}"
    return format_seeds(stat, col.fmt) if seeds else format_stat(stat, col.fmt)


def load_cell(runs: list[Run], seeds: bool = False) -> str:
    """The machine's 1-minute load average on its CPUs when the runs ended: the highest (seeds: each
    run's), '⚠ loaded' above LOADED_PER_CPU × CPUs."""
    loads = [(r.metric(MACHINE_LOAD.name), r.metric(MACHINE_CPUS.name) or 1) for r in runs]
    if all(load is None for load, _ in loads):
        return "not recorded"
    text = lambda load, cpus: "—" if load is None else f"{load:.1f}" + (" ⚠" if load > LOADED_PER_CPU * cpus else "")  # noqa: E731
    cpus = max(c for _, c in loads)
    if seeds:
        return ", ".join(text(load, c) for load, c in loads) + f" on {cpus} CPUs"
    load, cpus = max(((lo, c) for lo, c in loads if lo is not None), key=lambda lc: lc[0] / lc[1])
    return f"{load:.1f} on {cpus} CPUs" + (" ⚠ loaded" if load > LOADED_PER_CPU * cpus else "")


#: one table per family of columns, so each fits a terminal's width
FAMILIES: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("task accuracy (exact match) by evaluation length", lambda key: TASK_ACCURACY.match(key) is not None),
    ("quality", lambda key: not (target_of(key) or EXTRAPOLATION_PPL.match(key) or TASK_ACCURACY.match(key))),
    ("tokens to reach val/loss (or val/bpb: →xbpb), interpolated", lambda key: target_of(key) is not None),
    ("perplexity at evaluation length (tokens)", lambda key: EXTRAPOLATION_PPL.match(key) is not None),
)
COST = ("cost — each run timed once while it trained, not a benchmark (`posenc bench` times encodings side "
        "by side); machine load: 1-min load average when the run ended; kernel path: each layer kind's path, "
        "↓ a fallback (the path taken @ its step), ≠ paths unlike another run's of the same encoding")


def family_table(c: Comparison, title: str, columns: list[Column], seeds: bool, compact: bool) -> TextTable:
    """Rows of groups; the best cell of a column bold only where detectable, and a last row naming
    the leader or the tied groups."""
    header = [c.group_header, "n (seeds)", *[col.header for col in columns]]
    rows, best = [], set()
    for i, g in enumerate(c.groups):
        rows.append([g.label, runs_cell(g), *[cell_text(c, g, col, seeds) for col in columns]])
        best |= {(i, 2 + j) for j, col in enumerate(columns) if (lead := c.leaders.get(col.key)) and lead.best == g.label}
    if not seeds and len(c.groups) > 1 and c.leaders:  # with --within the rankings name a best per value
        leads = [leader_text(c.leaders.get(col.key), compact) for col in columns]
        reasons = {lead.reason for col in columns if (lead := c.leaders.get(col.key)) and lead.best is None and lead.reason}
        if len(leads) > 1 and len(reasons) == 1 and leads == [leads[0]] * len(leads) and leads[0] == next(iter(reasons)):
            leads = [leads[0], *[""] * (len(leads) - 1)]  # one reason for the whole row, said once
        rows.append(["best (Welch 95%)", "", *leads])
    return TextTable(f"{title} — {'per seed, in seed order' if seeds else INTERVAL}", header, rows, set() if seeds else best)


def cost_table(c: Comparison, columns: list[Column], seeds: bool) -> TextTable:
    """Each group's timings beside the machine's load and the kernels' paths they ran (report/kernel_paths.py)."""
    header = [c.group_header, "n (seeds)", *[col.header for col in columns], "machine load", kernel_paths.HEADER]
    rows = [[g.label, runs_cell(g), *[cell_text(c, g, col, seeds) for col in columns], load_cell(g.completed, seeds),
             kernel_paths.cell(g, c.runs)] for g in c.groups]
    return TextTable(f"{COST} — {'per seed, in seed order' if seeds else INTERVAL}", header, rows)


def text_tables(c: Comparison, seeds: bool = False, compact: bool = False) -> list[TextTable]:
    """One table per column family (task accuracy, quality, convergence, extrapolation, cost),
    each followed by its per-seed values when seeds is true, then the baseline differences.
    compact (a terminal): the leader row says 'tied' without the names."""
    tables = []
    for family, belongs in FAMILIES:
        columns = [col for col in c.columns if belongs(col.key) and not col.cost]
        if columns:
            tables += [family_table(c, family, columns, False, compact)]
            tables += [family_table(c, family, columns, True, compact)] if seeds else []
    cost = [col for col in c.columns if col.cost]
    if cost:
        tables += [cost_table(c, cost, False)] + ([cost_table(c, cost, True)] if seeds else [])
    if c.baseline is not None:
        tables.append(baseline_text_table(c))
    return tables


def baseline_text_table(c: Comparison) -> TextTable:
    """Each group against the baseline on the headline metric: mean, difference, verdict."""
    assert c.baseline is not None
    stat = lambda g: format_stat(g.stat(c.metric), c.metric_fmt)  # noqa: E731
    rows = [[c.baseline.label + " (baseline)", runs_cell(c.baseline), stat(c.baseline), "", ""]]
    for g in c.groups:
        if g is not c.baseline:
            v = c.versus[g.label]
            rows.append([g.label, runs_cell(g), stat(g), format_difference(v, c.metric_fmt), v.verdict])
    direction = "higher" if higher_is_better(c.metric) else "lower"
    ratio = any(v.difference is not None and v.difference.ratio for v in c.versus.values())
    what = "ratio to" if ratio else "difference to"
    return TextTable(f"{c.metric} against {c.baseline.label} ({direction} is better; Welch 95% interval)",
                     [c.group_header, "n (seeds)", f"{c.metric} [95% interval]", f"{what} {c.baseline.label}",
                      "verdict"], rows)


def rich_table(t: TextTable) -> Lines:
    """The table under its title. The title is a line of its own, wrapped at the terminal's width:
    as a table's title it would wrap at the table's, mid-phrase above two narrow columns."""
    table = Table()
    for j, head in enumerate(t.header):
        label = j == t.label_column
        table.add_column(head.removeprefix("ppl@"), justify="left" if label else "right",
                         style="bold cyan" if label else None)
    for i, row in enumerate(t.rows):
        table.add_row(*[f"[bold green]{escape(text)}[/]" if (i, j) in t.best else escape(text)
                        for j, text in enumerate(row)])
    return Lines(Text(t.title, style="table.title"), table)
