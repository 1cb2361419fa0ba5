"""Which arms of a comparison run an encoding that fails `posenc check`: their label carries MARK in
every table and figure, and one line says which properties fail. A run records the verdict when it
trains (summary.json's ``check``: posenc/check/verdict.py); a run made before that gets one from the
lookup the CLI hands `posenc compare` and `posenc plot extrapolation` (``verdict_of``), or none.
``mark_arms`` marks both what `posenc check` fails and what a checkpoint does not rebuild
(report/proved.py), as every comparison of arms does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from posenc.report.proved import mark_unproved
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


def mark_arms(groups: Sequence[Group], verdict_of: VerdictOf | None) -> tuple[list[str], list[str]]:
    """Every group marked as a comparison marks it: ✗check where its encoding fails `posenc check`
    (runs that recorded no verdict asking verdict_of), ✗ckpt where a checkpoint of its runs does not
    rebuild the model that trained; the lines for each."""
    fill_verdicts([run for group in groups for run in group.runs], verdict_of)
    return mark_failing(groups), mark_unproved(groups)
