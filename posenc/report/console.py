"""Rich output for people: the table at the end of a run."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from posenc.display.terminal import make_console
from posenc.record.metrics import (
    BEFORE_FIRST_EVAL_LOSS,
    DEFAULT_TARGETS,
    LOADED_PER_CPU,
    MACHINE_CPUS,
    MACHINE_LOAD,
    PARAMS,
    STEPS,
    TOKENS_PER_S,
    TOKENS_SEEN,
    TOKENS_TO_LOSS,
    VAL_BPB,
    VAL_LOSS,
    VAL_PPL,
    WALL_TIME,
)

console = make_console()


def _fmt(value, fmt: str) -> str:
    return "not defined" if value is None else fmt.format(value)


def _task_rows(table: Table, summary: dict) -> None:
    """A task run's headline: exact-match accuracy at each evaluated length, with its Wilson interval."""
    tasks = summary.get("tasks") or {}
    for r in tasks.get("lengths", []):
        label = f"{tasks.get('task', 'task')} accuracy @ {r['length']}" + (f" ({r['multiple']:g}×)" if "multiple" in r else "")
        if r.get("accuracy") is None:
            table.add_row(label, "not defined" + (f" ({r['skipped']})" if r.get("skipped") else ""))
        else:
            table.add_row(label, f"{100 * r['accuracy']:.1f}% [{100 * r['low']:.1f}%, {100 * r['high']:.1f}%], n={r['n']:,}")


def _target_rows(table: Table, summary: dict) -> None:
    """Tokens to each val/loss target; one reached before the first evaluation is only bounded by it.
    A task run (its loss over answer tokens alone) leaves out the default targets, which are
    language-modelling losses of the byte corpus and say nothing about it."""
    task = bool(summary.get("tasks"))
    targets = {k: m["target"] for k in summary if (m := TOKENS_TO_LOSS.match(k))
               and not (task and float(m["target"]) in DEFAULT_TARGETS)}
    for key, target in sorted(targets.items(), key=lambda kv: -float(kv[1])):
        value = summary[key]
        if value is not None and summary.get(BEFORE_FIRST_EVAL_LOSS.key(target=target)):
            text = f"before the first evaluation (≤ {value:,})"
        else:
            text = _fmt(value, "{:,}").replace("not defined", "not reached")
        table.add_row(f"tokens to {VAL_LOSS.name} {target}", text)


def differs_at_training_length(summary: dict, lengths: list[dict]) -> bool:
    """Whether ppl @ 1× and val/ppl show two different numbers in the table (to its 3 decimals):
    they score other windows of the validation split, but where both evaluators read the same
    tokens they agree (to 1e-7), and a note about a difference nobody sees only confuses."""
    val = summary.get(VAL_PPL.name)
    at_1x = [r.get("ppl") for r in lengths if r.get("multiple") == 1 or r.get("length") == summary.get("seq_len")]
    return val is not None and any(p is not None and f"{p:.3f}" != f"{val:.3f}" for p in at_1x)


def print_summary(summary: dict, run_dir: Path) -> None:
    """Quality, extrapolation, convergence and cost of one finished run, in one table; a task run
    (dataset=synthetic) leads with its accuracy at each evaluated length."""
    enc = summary.get("encoding", {})
    opts = "  ".join(f"{k}={v}" for k, v in enc.items() if k != "name")
    console.print(f"[bold]{enc.get('name', '?')}[/]  {opts}", highlight=False)
    table = Table(show_header=True, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    _task_rows(table, summary)
    for name, fmt in ((VAL_LOSS.name, "{:.4f}"), (VAL_PPL.name, "{:.3f}"), (VAL_BPB.name, "{:.4f}")):
        if name in summary:
            table.add_row(name, fmt.format(summary[name]))
    seq_len = summary.get("seq_len")
    lengths = (summary.get("extrapolation") or {}).get("lengths", [])
    for r in lengths:
        label = f"ppl @ {r['length']}" + (f" ({r['multiple']:g}×)" if seq_len else "")
        table.add_row(label, _fmt(r["ppl"], "{:.3f}"))
    _target_rows(table, summary)
    for name, key, fmt in (("steps", STEPS.name, "{:,}"), ("tokens", TOKENS_SEEN.name, "{:,}"), ("params", PARAMS.name, "{:,}"),
                           ("tokens/s", TOKENS_PER_S.name, "{:,.0f}"), ("wall time", WALL_TIME.name, "{:.1f} s")):
        if summary.get(key) is not None:
            table.add_row(name, fmt.format(summary[key]))
    if summary.get("world_size") is not None:  # how many processes trained it: part of the run, like its batch
        batch = f" (global batch {summary['global_batch']:,})" if summary.get("global_batch") is not None else ""
        table.add_row("world size (processes)", f"{summary['world_size']:,}{batch}")
    load, cpus = summary.get(MACHINE_LOAD.name), summary.get(MACHINE_CPUS.name) or 1
    if load is not None:  # tokens/s is one timing, taken on whatever else the machine ran
        busy = load > LOADED_PER_CPU * cpus
        table.add_row("machine load (1 min)", f"{load:.1f} on {cpus} CPUs" + (" ⚠ loaded: tokens/s is noise" if busy else ""))
    console.print(table)
    if differs_at_training_length(summary, lengths):  # two perplexities at T that disagree: say why
        console.print(f"val/*: the last in-training evaluation (trainer.eval_batches × the global batch windows of "
                      f"seq_len={seq_len}, validation split); ppl @ L: the extrapolation evaluator (eval.tokens of "
                      f"the validation split in windows of L), so ppl @ 1× scores other tokens than val/ppl.",
                      style="dim", highlight=False)
    console.print(f"run dir: [bold]{run_dir}[/]", highlight=False)
