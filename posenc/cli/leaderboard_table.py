"""A bare `posenc leaderboard`: the shipped rows as docs/leaderboard.md's main table, in the
terminal, without running anything or importing torch."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posenc.leaderboard.data import Baselines, load_baselines
from posenc.leaderboard.page import sort_key, table_note, table_rows
from posenc.leaderboard.protocol import DEFAULT_PROTOCOL, Protocol, load_protocol


def show_shipped(protocol_name: str | None, metric: str | None, console: Console) -> None:
    """The shipped table of the protocol (the default one unless named), one metric's where given."""
    protocol = load_protocol(protocol_name or DEFAULT_PROTOCOL)
    shipped_table(protocol, load_baselines(protocol), protocol.metric_named(metric) if metric else None, console)


def shipped_table(protocol: Protocol, baselines: Baselines, metric: str | None, console: Console) -> None:
    """The shipped rows as docs/leaderboard.md's main table, in the terminal (one metric where
    --metric names one, sorted by it), what a cell is, and how to place one's own among them."""
    metrics = {metric: protocol.metrics[metric]} if metric else protocol.metrics
    sort_metric = metric or sort_key(metrics)
    machine = baselines.raw["machine"]
    table = Table(title=f"{protocol.name}: {len(baselines.rows)} shipped encodings (mean [95% interval] "
                  f"{{rank interval}}; measured {baselines.raw['date']} on {machine['cpu']})", title_justify="left")
    table.add_column("encoding", style="bold cyan")
    for label in metrics.values():
        table.add_column(label, justify="right")
    table.add_column("minutes (all runs)", justify="right")
    table.add_column("posenc check")
    rows = table_rows(baselines, metrics, protocol.seeds, sort_metric)
    for row in rows:
        cells = [f"[bold]{escape(c)}[/]" if best else escape(c) for c, best in zip(row.cells, row.best)]
        table.add_row(escape(row.label) + (" *" if row.note else ""), *cells, f"{row.minutes:.1f}", escape(row.check))
    console.print(table)
    for row in rows:
        if row.note:
            console.print(f"* {row.label}: {row.note}", style="dim", highlight=False, soft_wrap=True)
    note = table_note(metrics, protocol.seeds, sort_metric).replace("[statistics.md](statistics.md)", "docs/statistics.md")
    console.print(note, style="dim", highlight=False, soft_wrap=True)
    flag = "" if protocol.source == DEFAULT_PROTOCOL else f" --protocol {protocol.source}"
    page = "docs/leaderboard.md" if protocol.source == DEFAULT_PROTOCOL else f"docs/leaderboard-{protocol.name}.md"
    console.print(f"place your own encoding among them: `posenc leaderboard encoding=mine{flag}` (3 seeds of each "
                  f"arm; `--config-dir DIR` for one kept outside posenc); one column: `posenc leaderboard --metric "
                  f"{sort_metric}{flag}`; every seed and the protocol: {page}", highlight=False, soft_wrap=True)
