"""How each compared run ran its kernels, beside its tokens/s and MFU.

A run's speed is its kernels' (posenc/record/kernel_record.py reads a run's record): two runs of one
encoding on unlike paths (one compiled FlexAttention, one the dense explicit-mask path after a
fallback, or uncompiled) are not one encoding's speed measured twice. So the cost table marks, for
each group, the runs that fell back (``↓dense@3``) and the runs whose paths differ from another run
of the same encoding (``≠``), and the report says that speed is not comparable across them. Runs
written before posenc kept a record are not marked ("not recorded").
"""

from __future__ import annotations

from collections.abc import Sequence

from posenc.record import kernel_record
from posenc.report.runs import Group, Run

#: the cost table's column
HEADER = "kernel path"
DIFFERS = "≠"


def record(run: Run) -> dict | None:
    return run.metric(kernel_record.KEY)


def encoding(run: Run) -> object:
    return run.config.get("encoding.name")


def unlike(run: Run, runs: Sequence[Run]) -> bool:
    """Whether run's paths differ from those of another finished run of the same encoding."""
    mine = kernel_record.signature(record(run))
    return bool(mine) and any(other is not run and encoding(other) == encoding(run) and record(other)
                              and kernel_record.signature(record(other)) != mine for other in runs if other.ok)


def cell(group: Group, runs: Sequence[Run]) -> str:
    """The group's paths ('global=flex, compiled'; several: each once), each run's fallbacks and ≠ where
    its paths differ from another run of its encoding."""
    completed = group.completed
    if not any(record(r) for r in completed):
        return "not recorded"
    paths = list(dict.fromkeys(kernel_record.signature(record(r)) or "not recorded" for r in completed))
    marks = [m for r in completed if (m := kernel_record.marks(record(r)))]
    differs = any(unlike(r, runs) for r in completed)
    return "; ".join(paths) + "".join(f" {m}" for m in dict.fromkeys(marks)) + (f" {DIFFERS}" if differs else "")


def warning_lines(runs: Sequence[Run]) -> list[str]:
    """One line when some runs fell back or ran unlike paths: their speed is not comparable."""
    finished = [r for r in runs if r.ok]
    fell = [r for r in finished if kernel_record.fell_back(record(r))]
    differ = [r for r in finished if unlike(r, finished)]
    if not fell and not differ:
        return []
    parts = ([f"{len(fell)} fell back from their fast path (↓: the path taken, @ the step)"] if fell else []) + \
        ([f"{len(differ)} ran other kernel paths than another run of their encoding ({DIFFERS})"] if differ else [])
    return [f"{' and '.join(parts)} of {len(finished)} runs: tokens/s and MFU are not comparable across unlike "
            f"paths (the cost table's '{HEADER}'; each run's summary says how it ran, under '{kernel_record.KEY}')"]
