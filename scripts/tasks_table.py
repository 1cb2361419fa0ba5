"""Accuracy against length of a task sweep as a Markdown table: one row per encoding, one column
per evaluation length, mean and 95% t-interval over seeds, clipped to [0, 100] (posenc.report.stats.aggregate).

    python scripts/tasks_table.py outputs/sweeps/<date>/<time>_tasks_length [--task flip_flop]

Reads each run's summary.json (tasks/<task>/accuracy@<length>); a length an encoding cannot
represent (null in every seed) prints as "n/a".
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from posenc.record.metrics import TASK_ACCURACY
from posenc.report.stats import aggregate, scale_of
from posenc.record.rundir import SUMMARY_FILE, RunDir


def collect(sweep: Path, task: str | None) -> tuple[str, dict[str, dict[int, list]]]:
    """(task, {encoding: {length: [accuracy per seed, None where not applicable]}})."""
    table: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for run in sorted(RunDir.under(sweep), key=_job_order):
        summary = run.summary() or {}
        for key, value in summary.items():
            match = TASK_ACCURACY.match(key)
            if match and (task is None or match["task"] == task):
                task = match["task"]
                table[summary["encoding"]["name"]][int(match["length"])].append(value)
    if task is None:
        raise SystemExit(f"error: no run under {sweep} has tasks/<task>/accuracy@<length> in its {SUMMARY_FILE}")
    return task, table


def _job_order(run: RunDir) -> tuple:
    """A sweep's runs in job order (0_nope, 1_nope, ..., 10_t5_bias), as Hydra numbered them."""
    head = run.path.name.split("_")[0]
    return (int(head) if head.isdigit() else -1, str(run.path))


def cell(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    s = aggregate(values, scale_of(TASK_ACCURACY.name))  # an accuracy: the interval stays inside [0, 1]
    return f"{100 * s.mean:.0f}" if s.low is None else f"{100 * s.mean:.0f} [{100 * s.low:.0f}, {100 * s.high:.0f}]"


def markdown(task: str, table: dict[str, dict[int, list]]) -> str:
    lengths = sorted({L for by_length in table.values() for L in by_length})
    seeds = max(len(v) for by_length in table.values() for v in by_length.values())
    head = f"| {task}: exact match, % (n={seeds} seeds) | " + " | ".join(f"{L}" for L in lengths) + " |"
    rule = "|---|" + "---:|" * len(lengths)
    rows = [f"| {enc} | " + " | ".join(cell(table[enc].get(L, [])) for L in lengths) + " |" for enc in table]
    return "\n".join([head, rule, *rows])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--task", default=None)
    args = parser.parse_args()
    print(markdown(*collect(args.sweep, args.task)))
