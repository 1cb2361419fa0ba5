"""`posenc compare`: runs on disk -> a table in the terminal, PNG plots, report.md/report.html.

Fully offline: everything is read from the run directories (no W&B). Groups are the
combinations of the swept keys (auto-detected from the runs' overrides, or --by); seeds are
aggregated as mean ± sample std. Failed and unfinished runs are listed, never averaged in.
"""

from __future__ import annotations

import base64
import html
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from posenc.metrics import (DEFAULT_TARGETS, EXTRAPOLATION_PPL, TOKENS_PER_S, TOKENS_TO_LOSS, VAL_BPB, VAL_LOSS,
                            VAL_LOSS_AUC, VAL_PPL, convergence_metrics, lookup)
from posenc.report.plots import plot_convergence, plot_final, plot_tokens_to_target
from posenc.report.plots_length import plot_extrapolation
from posenc.report.runs import Group, Run, Stat, aggregate, find_runs, group_runs, varying_keys
from posenc.rundir import read_sweep


@dataclass(frozen=True)
class Column:
    key: str              # the summary key
    header: str
    fmt: str              # "loss" | "ppl" | "tokens" | "rate"

    @property
    def lower_is_better(self) -> bool:
        """From the metric's declaration (posenc.metrics); an undeclared key: lower."""
        metric = lookup(self.key)
        return metric is None or metric.lower_is_better


BASE_COLUMNS = [
    Column(VAL_LOSS.name, VAL_LOSS.name, "loss"),
    Column(VAL_PPL.name, VAL_PPL.name, "ppl"),
    Column(VAL_BPB.name, VAL_BPB.name, "loss"),
    Column(VAL_LOSS_AUC.name, "AUC", "loss"),
]
RATE_COLUMN = Column(TOKENS_PER_S.name, "tokens/s", "rate")


def convergence_targets(runs: Sequence[Run], asked: Sequence[float] | None) -> list[float]:
    """--target values, else the targets the runs were trained with, else the defaults."""
    found = {float(m["target"]) for r in runs if r.ok for k in r.summary if (m := TOKENS_TO_LOSS.match(k))}
    return sorted(asked or found or DEFAULT_TARGETS, reverse=True)


def columns_for(runs: Sequence[Run], metric: str, targets: Sequence[float]) -> list[Column]:
    """The table's columns: quality, convergence (one per target), extrapolation, speed."""
    keys = {k for r in runs if r.ok for k in r.summary}
    cols = [c for c in BASE_COLUMNS if c.key in keys]
    cols += [Column(TOKENS_TO_LOSS.key(target=t), f"→{t:g}", "tokens") for t in targets]
    cols += [Column(k, f"ppl@{EXTRAPOLATION_PPL.match(k)['length']}", "ppl")
             for k in sorted(keys, key=_length_order) if EXTRAPOLATION_PPL.match(k)]
    if metric not in {c.key for c in cols} and metric in keys:
        cols.insert(0, Column(metric, metric, "loss"))
    if RATE_COLUMN.key in keys:
        cols.append(RATE_COLUMN)
    return cols


def _length_order(key: str) -> tuple:
    digits = re.findall(r"\d+", key)
    return (key.split("@")[0], int(digits[-1]) if digits else 0)


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
    return f"{value:.4f}"


def format_stat(stat: Stat, fmt: str, sep: str = " ± ") -> str:
    if stat.mean is None:
        return "—" if stat.reached == 0 else f"{stat.reached}/{stat.n} seeds"
    text = format_number(stat.mean, fmt)
    return text if stat.n < 2 else f"{text}{sep}{format_number(stat.std, fmt)}"


@dataclass
class Comparison:
    by: list[str]
    groups: list[Group]
    columns: list[Column]
    targets: list[float]
    cells: dict[tuple[str, str], Stat]   # (group label, column key) -> stat
    best: dict[str, float]               # column key -> best mean

    @property
    def failed(self) -> list[Run]:
        return [r for g in self.groups for r in g.failed]


def build_comparison(runs: Sequence[Run], by: Sequence[str] | None, metric: str,
                     targets: Sequence[float] | None = None) -> Comparison:
    by = list(by) if by else varying_keys(runs)
    groups = group_runs(runs, by)
    targets = convergence_targets(runs, targets)
    for run in runs:
        # convergence is the run's own (summary.json); targets it was not trained with come from
        # its metrics.jsonl through the same function
        missing = [t for t in targets if TOKENS_TO_LOSS.key(target=t) not in (run.summary or {})]
        if run.ok and (missing or VAL_LOSS_AUC.name not in run.summary):
            for key, value in convergence_metrics(run.rows, missing).items():
                run.summary.setdefault(key, value)
    columns = columns_for(runs, metric, targets)
    cells, best = {}, {}
    for col in columns:
        for g in groups:
            stat = aggregate(g.values(col.key)) if g.completed else Stat(None, None, 0, 0)
            cells[(g.label, col.key)] = stat
            if stat.mean is not None:
                better = min if col.lower_is_better else max
                best[col.key] = better(best.get(col.key, stat.mean), stat.mean)
    return Comparison(by, groups, columns, targets, cells, best)


def runs_cell(group: Group) -> str:
    """Completed seeds, and how many were left out: `2 (+1 failed, +1 unfinished)`."""
    left_out = [f"+{sum(r.status == s for r in group.failed)} {s}" for s in ("failed", "unfinished")
                if any(r.status == s for r in group.failed)]
    return f"{len(group.completed)}" + (f" ({', '.join(left_out)})" if left_out else "")


def is_best(c: Comparison, g: Group, col: Column) -> bool:
    stat = c.cells[(g.label, col.key)]
    return stat.mean is not None and stat.mean == c.best.get(col.key) and len(c.groups) > 1


#: the terminal shows one table per family of columns, so each fits a terminal's width
FAMILIES = (
    ("quality", lambda key: not (TOKENS_TO_LOSS.match(key) or EXTRAPOLATION_PPL.match(key)) and key != RATE_COLUMN.key),
    ("tokens to reach val/loss", lambda key: TOKENS_TO_LOSS.match(key) is not None),
    ("perplexity at evaluation length (tokens)", lambda key: EXTRAPOLATION_PPL.match(key) is not None),
    ("cost", lambda key: key == RATE_COLUMN.key),
)


def rich_tables(c: Comparison) -> list[Table]:
    """The comparison as rich tables, one per column family (quality, convergence,
    extrapolation, cost), each with the group and runs columns; best value per column green."""
    tables = []
    for family, belongs in FAMILIES:
        columns = [col for col in c.columns if belongs(col.key)]
        if not columns:
            continue
        table = Table(title=family, title_justify="left")
        table.add_column(", ".join(c.by) or "group", style="bold cyan")
        table.add_column("runs", justify="right")
        for col in columns:
            table.add_column(col.header.removeprefix("ppl@"), justify="right")
        for g in c.groups:
            cells = [format_stat(c.cells[(g.label, col.key)], col.fmt) for col in columns]
            cells = [f"[bold green]{text}[/]" if is_best(c, g, col) else text for text, col in zip(cells, columns)]
            table.add_row(g.label, runs_cell(g), *cells)
        tables.append(table)
    return tables


def markdown_table(c: Comparison) -> str:
    header = [", ".join(c.by) or "group", "runs", *[col.header for col in c.columns]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for g in c.groups:
        cells = [format_stat(c.cells[(g.label, col.key)], col.fmt) for col in c.columns]
        cells = [f"**{text}**" if is_best(c, g, col) else text for text, col in zip(cells, c.columns)]
        lines.append("| " + " | ".join([g.label, runs_cell(g), *cells]) + " |")
    return "\n".join(lines)


def failed_lines(c: Comparison, root: Path) -> list[str]:
    out = []
    for run in c.failed:
        error = run.metric("error") or ("no summary.json: still running or killed" if run.status == "unfinished" else "")
        out.append(f"{_relative(run.path, root)}: {run.status}" + (f" — {error}" if error else ""))
    return out


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def default_out(paths: Sequence[Path]) -> Path:
    """One sweep (or folder) given: write there. Several paths, or one run: a new folder."""
    if len(paths) == 1 and not (Path(paths[0]) / ".hydra").is_dir():
        return Path(paths[0])
    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d/%H-%M-%S")


def compare(paths: Sequence[Path], by: Sequence[str] | None = None, metric: str = VAL_PPL.name,
            out: Path | None = None, targets: Sequence[float] | None = None, console: Console | None = None) -> Path:
    """Compare the runs under paths; print the table; write plots and reports into out."""
    console = console or Console()
    runs = find_runs(paths)
    c = build_comparison(runs, by, metric, targets)
    out = Path(out) if out else default_out(paths)
    out.mkdir(parents=True, exist_ok=True)
    sweep = read_sweep(Path(paths[0])) if len(paths) == 1 else None
    title = f"{sweep['name'] if sweep else 'comparison'}: {len(runs)} runs"
    by_text = ", ".join(c.by) or "nothing varies"

    console.print(f"[bold]{title}[/], grouped by {by_text} (mean ± std over seeds)", highlight=False)
    for table in rich_tables(c):
        console.print(table)
    failed = failed_lines(c, out)
    for line in failed:
        console.print(f"[bold red]not averaged in:[/] {line}", highlight=False)

    plots = [
        plot_convergence(c.groups, out / "convergence.png", f"Validation loss, {title}", c.targets),
        plot_final(c.groups, c.by, metric, out / f"final_{re.sub(r'[^A-Za-z0-9@.]+', '_', metric)}.png",
                   f"Final {metric} by {by_text}"),
        plot_tokens_to_target(c.groups, c.targets, out / "tokens_to_loss.png", "Tokens to reach a validation loss"),
    ]
    if any(EXTRAPOLATION_PPL.match(col.key) for col in c.columns):  # some finished run was evaluated at other lengths
        plots.append(plot_extrapolation(c.groups, out / "extrapolation.png", f"Perplexity against length, {title}"))
    write_markdown(out / "report.md", c, title, sweep, failed, plots)
    write_html(out / "report.html", c, title, sweep, failed, plots)
    console.print(f"report: [bold]{out / 'report.html'}[/] (and report.md, {', '.join(p.name for p in plots)})")
    return out


NOTES = ("Mean ± sample std (n−1) over seeds. Best value per column in bold. "
         "→x: tokens until val/loss first ≤ x (—: never; k/n seeds: only k got there, so no mean). "
         "AUC: area under val/loss(tokens) / token span = token-weighted mean val/loss (lower = faster).")


def write_markdown(path: Path, c: Comparison, title: str, sweep: dict | None, failed: list[str], plots: list[Path]) -> None:
    parts = [f"# {title}", ""]
    if sweep:
        parts += [f"Command: `{sweep['command']}` (started {sweep['started']})", ""]
    parts += [markdown_table(c), "", NOTES, ""]
    if failed:
        parts += ["## Failed or unfinished (not averaged in)", "", *[f"- {line}" for line in failed], ""]
    parts += [f"![{p.stem}]({p.name})" for p in plots]
    path.write_text("\n".join(parts) + "\n")


def write_html(path: Path, c: Comparison, title: str, sweep: dict | None, failed: list[str], plots: list[Path]) -> None:
    """One self-contained file: the PNGs are embedded as base64, so it can be mailed or attached."""
    head = ["<th>" + html.escape(h) + "</th>" for h in [", ".join(c.by) or "group", "runs", *[col.header for col in c.columns]]]
    rows = []
    for g in c.groups:
        cells = [html.escape(format_stat(c.cells[(g.label, col.key)], col.fmt)) for col in c.columns]
        cells = [f"<b>{t}</b>" if is_best(c, g, col) else t for t, col in zip(cells, c.columns)]
        rows.append("<tr>" + "".join(f"<td>{t}</td>" for t in [html.escape(g.label), runs_cell(g), *cells]) + "</tr>")
    images = [f'<img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">' for p in plots]
    body = [f"<h1>{html.escape(title)}</h1>"]
    if sweep:
        body.append(f"<p>Command: <code>{html.escape(sweep['command'])}</code> (started {html.escape(sweep['started'])})</p>")
    body += [f"<table><tr>{''.join(head)}</tr>{''.join(rows)}</table>", f"<p class=note>{html.escape(NOTES)}</p>"]
    if failed:
        body += ["<h2>Failed or unfinished (not averaged in)</h2><ul>",
                 *[f"<li>{html.escape(line)}</li>" for line in failed], "</ul>"]
    body += images
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
             "img{max-width:100%;display:block;margin:1em 0}.note{color:#555;font-size:90%}")
    path.write_text(f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
                    f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
