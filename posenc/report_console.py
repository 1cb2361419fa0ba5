"""Rich output for people: the table at the end of a run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console()


def print_summary(summary: dict, run_dir: Path) -> None:
    enc = summary.get("encoding", {})
    opts = ", ".join(f"{k}={v}" for k, v in enc.items() if k != "name")
    table = Table(title=f"{enc.get('name', '?')}" + (f" ({opts})" if opts else ""), title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("val/loss", summary.get("val/loss"), "{:.4f}"),
        ("val/ppl", summary.get("val/ppl"), "{:.3f}"),
        ("val/bpb", summary.get("val/bpb"), "{:.4f}"),
        ("steps", summary.get("steps"), "{:,}"),
        ("tokens", summary.get("tokens"), "{:,}"),
        ("params", summary.get("params"), "{:,}"),
        ("tokens/s", summary.get("tokens_per_s"), "{:,.0f}"),
        ("wall time", summary.get("wall_time_s"), "{:.1f} s"),
    ]
    for name, value, fmt in rows:
        if value is not None:
            table.add_row(name, fmt.format(value))
    console.print(table)
    console.print(f"run dir: [bold]{run_dir}[/]")
