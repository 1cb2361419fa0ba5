"""Which arms of a comparison run an encoding that fails `posenc check`: their label carries MARK in
every table and figure, and one line says which properties fail. A run records the verdict when it
trains (summary.json's ``check``: posenc/check/verdict.py); a run made before that gets one from the
lookup the CLI hands `posenc compare` (``verdict_of``), or none."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from posenc.report.runs import Group, Run

#: what a failing arm's label ends with
MARK = " ✗check"
#: a run's verdict from its directory, for runs that recorded none (None: not known)
VerdictOf = Callable[[Path], "dict | None"]


def fill_verdicts(runs: Sequence[Run], verdict_of: VerdictOf | None) -> None:
    """Into each finished run's summary that has no ``check``: the lookup's verdict, where it has one."""
    if verdict_of is None:
        return
    for run in runs:
        if run.ok and "check" not in run.summary:
            verdict = verdict_of(run.path)
            if verdict is not None:
                run.summary["check"] = verdict


def failed_properties(group: Group) -> list[str]:
    """The properties any finished run of the group fails, in the order first met."""
    found: list[str] = []
    for run in group.completed:
        verdict = run.summary.get("check") or {}
        found += [name for name in verdict.get("failed") or [] if name not in found]
    return found


def mark_failing(groups: Sequence[Group]) -> list[str]:
    """MARK on the label of every group whose encoding fails a property; a line for each."""
    lines = []
    for group in groups:
        failed = failed_properties(group)
        if failed:
            lines.append(f"{group.label}{MARK}: its encoding fails posenc check ({'; '.join(failed)}), so its numbers "
                         f"are not about positional encoding alone")
            group.label += MARK
    return lines
