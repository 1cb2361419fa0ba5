"""Where a run records whether a model rebuilt from its checkpoint computed what the trained model
computed (posenc/eval/proof.py measures it): ``checkpoint_proof`` in eval.json and probes.json (that
command's rebuild) and in an init_from child's ``parent`` entry, and ``checkpoint_proofs`` in
summary.json (each rebuild during the run: an init_from parent's, each resume's, and the run's own
rebuild of its kept checkpoint at its end). Each record's ``holds`` is True, False (with the
``cause``), or None (a checkpoint saved before checkpoints held a probe batch: not known).

`posenc compare` and `posenc plot extrapolation` read them here to mark an arm whose numbers its
checkpoints cannot reproduce (report/proved.py)."""

from __future__ import annotations

from posenc.record.rundir import RunDir

#: one rebuild's record (eval.json, probes.json, an init_from parent's entry)
RECORD = "checkpoint_proof"
#: summary.json's records of the rebuilds during the run
RECORDS = "checkpoint_proofs"


def failed(record: dict | None) -> bool:
    """A record saying the rebuilt model did not compute the trained one's outputs (None and "cannot
    prove" do not say so)."""
    return isinstance(record, dict) and record.get("holds") is False


def failures(run: RunDir | str, summary: dict | None = None) -> list[dict]:
    """Every record of the run that failed: its summary's (``summary`` where already read) and each
    evaluation's, the latter with the file named (``"in": "eval.json"``)."""
    run = RunDir.of(run)
    summary = run.summary() if summary is None else summary
    found = [r for r in (summary or {}).get(RECORDS) or [] if failed(r)]
    found += [{**record[RECORD], "in": name} for name, record in run.evaluations().items() if failed(record.get(RECORD))]
    return found
