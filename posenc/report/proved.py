"""Which arms of a comparison hold a run whose checkpoint did not rebuild the model that trained (a
non-persistent buffer drawn anew in each build, code changed since): their label carries MARK in
every table and figure, and one line says which run and why. A run records each rebuild of its model
from a checkpoint (its own at its end, a resume's, an init_from parent's: summary.json) and `posenc
eval` the rebuild it scored (eval.json): posenc/record/proofs.py; posenc/eval/proof.py compares."""

from __future__ import annotations

from collections.abc import Sequence

from posenc.record.proofs import failures
from posenc.record.rundir import RunDir
from posenc.report.runs import Group

#: what the label of an arm with such a run ends with
MARK = " ✗ckpt"


def mark_unproved(groups: Sequence[Group]) -> list[str]:
    """MARK on the label of every group with a finished run whose checkpoint did not rebuild its model;
    a line for each, naming the first such run and its cause."""
    lines = []
    for group in groups:
        found = [(run, failed) for run in group.completed
                 if (failed := failures(RunDir(run.path), run.summary))]
        if not found:
            continue
        run, [first, *_] = found[0]
        where = first.get("in") or first.get("at") or "a rebuild"
        lines.append(f"{group.label}{MARK}: {len(found)} of its {len(group.completed)} runs' checkpoints do not "
                     f"rebuild the model that trained ({run.path.name}, {where}: {first.get('cause', 'unknown')}), so "
                     f"its numbers cannot be reproduced from them")
        group.label += MARK
    return lines
