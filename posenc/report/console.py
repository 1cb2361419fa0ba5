"""Rich output for people: the table at the end of a run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console()


def _fmt(value, fmt: str) -> str:
    return "not defined" if value is None else fmt.format(value)


def print_summary(summary: dict, run_dir: Path) -> None:
    """Quality, extrapolation, convergence and cost of one finished run, in one table."""
    enc = summary.get("encoding", {})
    opts = "  ".join(f"{k}={v}" for k, v in enc.items() if k != "name")
    console.print(f"[bold]{enc.get('name', '?')}[/]  {opts}", highlight=False)
    table = Table(show_header=True, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, fmt in (("val/loss", "{:.4f}"), ("val/ppl", "{:.3f}"), ("val/bpb", "{:.4f}")):
        if name in summary:
            table.add_row(name, fmt.format(summary[name]))
    seq_len = summary.get("seq_len")
    for r in (summary.get("extrapolation") or {}).get("lengths", []):
        label = f"ppl @ {r['length']}" + (f" ({r['multiple']:g}×)" if seq_len else "")
        table.add_row(label, _fmt(r["ppl"], "{:.3f}"))
    targets = [k for k in summary if k.startswith("convergence/tokens_to_loss@")]
    for key in sorted(targets, key=lambda k: -float(k.rsplit("@", 1)[1])):
        table.add_row(f"tokens to val/loss {key.rsplit('@', 1)[1]}", _fmt(summary[key], "{:,}").replace("not defined", "not reached"))
    for name, key, fmt in (("steps", "steps", "{:,}"), ("tokens", "tokens", "{:,}"), ("params", "params", "{:,}"),
                           ("tokens/s", "tokens_per_s", "{:,.0f}"), ("wall time", "wall_time_s", "{:.1f} s")):
        if summary.get(key) is not None:
            table.add_row(name, fmt.format(summary[key]))
    console.print(table)
    console.print(f"run dir: [bold]{run_dir}[/]", highlight=False)
