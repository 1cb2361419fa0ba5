"""The comparison as tables of text: cells (mean and 95% interval over seeds), the seeds of each
group, the best value per column, the baseline differences and the rankings; rendered alike to
the terminal (rich), report.md and report.html (report/document.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from posenc.metrics import EXTRAPOLATION_PPL, TOKENS_PER_S, target_of
from posenc.report.document import TextTable
from posenc.report.runs import Group, Stat, aggregate, format_value
from posenc.report.verdicts import Versus, higher_is_better

if TYPE_CHECKING:
    from posenc.report.compare import Column, Comparison


def format_number(value: float, fmt: str) -> str:
    if fmt == "tokens":
        for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(value) >= scale:
                return f"{value / scale:.3g}{unit}"
        return f"{value:.0f}"
    if fmt == "rate":
        return f"{value:,.0f}"
    if fmt == "ppl":
        return f"{value:.3f}"
    if fmt == "accuracy":
        return f"{100 * value:.1f}%"
    return f"{value:.4f}"


def format_stat(stat: Stat, fmt: str, compact: bool = False) -> str:
    """'2.2000 [1.7032, 2.6968]': the mean over seeds and its 95% t-interval; one seed: the value.
    compact (a terminal's width): '2.2000 ±0.4968', the interval's half-width (it is symmetric)."""
    if stat.mean is None:
        return "—" if stat.reached == 0 else f"{stat.reached}/{stat.n} seeds"
    text = format_number(stat.mean, fmt)
    if stat.low is None:
        return text
    if compact:
        return f"{text} ±{format_number(stat.half_width, fmt)}"
    low, high = (max(stat.low, 0.0), min(stat.high, 1.0)) if fmt == "accuracy" else (stat.low, stat.high)
    return f"{text} [{format_number(low, fmt)}, {format_number(high, fmt)}]"


#: how the tables say what a cell holds
INTERVAL = "mean [95% interval over seeds]"
HALF_WIDTH = "mean ± half-width of the 95% interval over seeds (not the std)"


def spread(compact: bool) -> str:
    """A column header's note on what follows the mean."""
    return "± 95% half-width" if compact else "[95% interval]"


def format_difference(v: Versus, fmt: str) -> str:
    """'+0.0123 [-0.0100, +0.0346]': group minus baseline with Welch's 95% interval."""
    d = v.difference
    if d is None:
        return "—"
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


def is_best(c: Comparison, g: Group, col: Column) -> bool:
    stat = c.cells[(g.label, col.key)]
    return stat.mean is not None and stat.mean == c.best.get(col.key) and len(c.groups) > 1


#: the terminal shows one table per family of columns, so each fits a terminal's width
FAMILIES = (
    ("quality", lambda key: not (target_of(key) or EXTRAPOLATION_PPL.match(key)) and key != TOKENS_PER_S.name),
    ("tokens to reach val/loss (or val/bpb: →xbpb), interpolated", lambda key: target_of(key) is not None),
    ("perplexity at evaluation length (tokens)", lambda key: EXTRAPOLATION_PPL.match(key) is not None),
    ("cost", lambda key: key == TOKENS_PER_S.name),
)


def text_tables(c: Comparison, compact: bool = False) -> list[TextTable]:
    """The comparison as tables of text, rendered alike to the terminal, markdown and html: one per
    column family (quality, convergence, extrapolation, cost), then the baseline differences and
    the rankings within another key when asked for. compact: intervals as ±half-width."""
    tables = []
    cell = lambda stat, fmt: format_stat(stat, fmt, compact)  # noqa: E731
    for family, belongs in FAMILIES:
        columns = [col for col in c.columns if belongs(col.key)]
        if not columns:
            continue
        header = [", ".join(c.by) or "group", "n (seeds)", *[col.header for col in columns]]
        rows, best = [], set()
        for i, g in enumerate(c.groups):
            rows.append([g.label, runs_cell(g), *[cell(c.cells[(g.label, col.key)], col.fmt) for col in columns]])
            best |= {(i, 2 + j) for j, col in enumerate(columns) if is_best(c, g, col)}
        tables.append(TextTable(f"{family} — {HALF_WIDTH if compact else INTERVAL}", header, rows, best))
    if c.baseline is not None:
        tables.append(baseline_text_table(c, compact))
    for value, ranked in c.rankings.items():
        rows = [[str(r.rank) if r.rank is not None else "—", r.group.label, runs_cell(r.group),
                 cell(r.stat, c.metric_fmt)] for r in ranked]
        tables.append(TextTable(f"{c.within} = {value}: ranking by {c.metric} (1 = best)",
                                ["rank", ", ".join(c.by) or "group", "n (seeds)", f"{c.metric} {spread(compact)}"], rows,
                                label_column=1))
    return tables


def baseline_text_table(c: Comparison, compact: bool = False) -> TextTable:
    """Each group against the baseline on the headline metric: mean, difference, verdict."""
    assert c.baseline is not None
    stat = lambda g: format_stat(c.cells.get((g.label, c.metric)) or aggregate(g.values(c.metric)),  # noqa: E731
                                 c.metric_fmt, compact)
    rows = [[c.baseline.label + " (baseline)", runs_cell(c.baseline), stat(c.baseline), "", ""]]
    for g in c.groups:
        if g is c.baseline:
            continue
        v = c.versus[g.label]
        rows.append([g.label, runs_cell(g), stat(g), format_difference(v, c.metric_fmt), v.verdict])
    direction = "higher" if higher_is_better(c.metric) else "lower"
    return TextTable(f"{c.metric} against {c.baseline.label} ({direction} is better; Welch 95% interval)",
                     [", ".join(c.by) or "group", "n (seeds)", f"{c.metric} {spread(compact)}",
                      f"difference to {c.baseline.label}", "verdict"], rows)


def rich_table(t: TextTable) -> Table:
    table = Table(title=t.title, title_justify="left")
    for j, head in enumerate(t.header):
        label = j == t.label_column
        table.add_column(head.removeprefix("ppl@"), justify="left" if label else "right",
                         style="bold cyan" if label else None)
    for i, row in enumerate(t.rows):
        table.add_row(*[f"[bold green]{escape(text)}[/]" if (i, j) in t.best else escape(text)
                        for j, text in enumerate(row)])
    return table
