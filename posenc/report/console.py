"""Rich output for people: the table at the end of a run."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from posenc.metrics import (LOADED_PER_CPU, MACHINE_CPUS, MACHINE_LOAD, PARAMS, STEPS, TOKENS_PER_S, TOKENS_SEEN,
                            TOKENS_TO_LOSS, VAL_BPB, VAL_LOSS, VAL_PPL, WALL_TIME)
from posenc.terminal import make_console

console = make_console()


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
    for name, fmt in ((VAL_LOSS.name, "{:.4f}"), (VAL_PPL.name, "{:.3f}"), (VAL_BPB.name, "{:.4f}")):
        if name in summary:
            table.add_row(name, fmt.format(summary[name]))
    seq_len = summary.get("seq_len")
    lengths = (summary.get("extrapolation") or {}).get("lengths", [])
    for r in lengths:
        label = f"ppl @ {r['length']}" + (f" ({r['multiple']:g}×)" if seq_len else "")
        table.add_row(label, _fmt(r["ppl"], "{:.3f}"))
    targets = {k: m["target"] for k in summary if (m := TOKENS_TO_LOSS.match(k))}
    for key, target in sorted(targets.items(), key=lambda kv: -float(kv[1])):
        table.add_row(f"tokens to {VAL_LOSS.name} {target}", _fmt(summary[key], "{:,}").replace("not defined", "not reached"))
    for name, key, fmt in (("steps", STEPS.name, "{:,}"), ("tokens", TOKENS_SEEN.name, "{:,}"), ("params", PARAMS.name, "{:,}"),
                           ("tokens/s", TOKENS_PER_S.name, "{:,.0f}"), ("wall time", WALL_TIME.name, "{:.1f} s")):
        if summary.get(key) is not None:
            table.add_row(name, fmt.format(summary[key]))
    load, cpus = summary.get(MACHINE_LOAD.name), summary.get(MACHINE_CPUS.name) or 1
    if load is not None:  # tokens/s is one timing, taken on whatever else the machine ran
        busy = load > LOADED_PER_CPU * cpus
        table.add_row("machine load (1 min)", f"{load:.1f} on {cpus} CPUs" + (" ⚠ loaded: tokens/s is noise" if busy else ""))
    console.print(table)
    if lengths:  # two perplexities at the training length: say what each scores
        console.print(f"val/*: the last in-training evaluation (trainer.eval_batches·batch_size windows of "
                      f"seq_len={seq_len}, validation split); ppl @ L: the extrapolation evaluator (eval.tokens of "
                      f"the validation split in windows of L), so ppl @ 1× scores other tokens than val/ppl.",
                      style="dim", highlight=False)
    console.print(f"run dir: [bold]{run_dir}[/]", highlight=False)
