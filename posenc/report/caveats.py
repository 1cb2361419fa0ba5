"""What a reader of a comparison must not over-read: arms whose encoding fails `posenc check` or whose
checkpoints do not rebuild the model that trained, timings taken on a loaded machine or on unlike
kernel paths, runs at different global batches, convergence targets no run crossed. One line each,
printed under compare's tables and written into its report."""

from __future__ import annotations

from posenc.record.metrics import (
    LOADED_PER_CPU,
    MACHINE_CPUS,
    MACHINE_LOAD,
    MACHINE_THREADS,
)
from posenc.record.rundir import SUMMARY_FILE
from posenc.report import kernel_paths
from posenc.report.comparison import Comparison
from posenc.report.runs import Run


def warning_lines(c: Comparison) -> list[str]:
    """What a reader must not over-read: arms whose encoding fails `posenc check` or whose checkpoints do
    not rebuild their model (report/proved.py), timings from a loaded machine, targets left out."""
    out = [*c.unchecked, *c.unproved]
    loaded = [(r, r.metric(MACHINE_LOAD.name), r.metric(MACHINE_CPUS.name) or 1) for r in c.runs if r.ok]
    loaded = [(r, load, cpus) for r, load, cpus in loaded if load is not None and load > LOADED_PER_CPU * cpus]
    if loaded:
        worst = max(load / cpus for _, load, cpus in loaded)
        out.append(f"{len(loaded)} of {len(c.runs)} runs ended with the machine loaded (up to {worst:.1f}× its CPUs "
                   "busy): their tokens/s measures the other processes as much as the encoding — time encodings "
                   "with `posenc bench` on a quiet machine")
    if any(col.cost for col in c.columns):
        out += kernel_paths.warning_lines(c.runs)  # speed measured on unlike kernel paths
    out += batch_lines([r for r in c.runs if r.ok]) + thread_lines([r for r in c.runs if r.ok])
    if c.dropped_targets:
        out.append(f"convergence targets left out: {', '.join(map(str, c.dropped_targets))} — no run's loss came down "
                   "through them (each run was already below at its first evaluation, or never got there); "
                   "give --target for others")
    return out


def batch_lines(runs: list[Run]) -> list[str]:
    """How the runs took their steps, where that differs: at different global batches (windows a
    step: trainer.batch_size × grad_accum × processes) they compare more than the table varies; a
    run resumed at another (trainer.resume_reshape) mixes two."""
    batches = sorted({b for r in runs if (b := r.metric("global_batch")) is not None})
    reshaped = [r.path.name for r in runs if r.metric("reshapes")]
    return ([f"the runs trained at different global batches ({', '.join(map(str, batches))} windows a step: trainer."
             "batch_size × grad_accum × processes): their curves and budgets differ in more than what the table varies"]
            if len(batches) > 1 else []) + \
        ([f"{len(reshaped)} run(s) resumed on another number of processes or global batch (trainer.resume_reshape, "
          f"the reshapes in their summaries): {', '.join(reshaped)}"] if reshaped else [])


def thread_lines(runs: list[Run]) -> list[str]:
    """CPU runs that trained on different torch thread counts (posenc.hardware.choose_cpu_threads: fewer on
    a loaded machine): a CPU step's sums change in their last bits with the count, so such runs differ a
    little by that alone, and their tokens/s more."""
    counts = sorted({n for r in runs if str(r.metric("device") or "").startswith("cpu")
                     and (n := r.metric(MACHINE_THREADS.name)) is not None})
    if len(counts) < 2:
        return []
    return [f"the CPU runs trained on different torch thread counts ({', '.join(map(str, counts))}: {SUMMARY_FILE}'s "
            f"{MACHINE_THREADS.name}): their numbers differ in the last digits and their tokens/s by that alone — "
            "OMP_NUM_THREADS=N gives every run the same count"]
