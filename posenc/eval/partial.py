"""`posenc eval` keeps what it finished: its record (``eval.json``, ``eval_<setting>.json``) is
written after each length, and the same evaluation run again takes it back.

Each length's result is written as it completes (atomically: posenc/record/directory.py) with
``complete: false`` and ``missing``, the stages still to run, until the last; so a Ctrl-C (or a
killed process) leaves a readable record of the lengths it finished and says what it lacks. The
same `posenc eval` command run again finds that record and runs only what is missing, where the
record's ``resume_key`` is this evaluation's: a hash of the checkpoint read (its file name, size,
modification time and step), the composed config with the overrides, and the changes to the
encoding's code since training. A record with another key (another checkpoint, other settings,
other code) or a finished one is replaced, as a new evaluation always replaced its file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.errors import UserError
from posenc.eval.progress import Stage, in_words
from posenc.record.directory import write_json_atomic

KEY = "resume_key"


class EvaluationInterrupted(UserError):
    """Ctrl-C during `posenc eval`: what it finished is on disk, and the same command finishes it."""

    exit_code = 130  # the shell's convention for a stop by SIGINT


def evaluation_key(cfg: DictConfig, checkpoint: Path, step: int | None, code_changes: list[str]) -> str:
    """What an evaluation's results depend on, hashed: the checkpoint read (name, size, modification
    time, step: a resumed or retrained run writes a new one), the whole composed config (the
    overrides in it) and the encoding code's changes since training."""
    stat = checkpoint.stat()
    what = {"checkpoint": [checkpoint.name, stat.st_size, stat.st_mtime_ns, step],
            "config": OmegaConf.to_container(cfg, resolve=False), "code_changes": code_changes}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_record(path: Path, key: str) -> tuple[dict | None, bool]:
    """(the record at path where it is an interrupted evaluation's with this key, else None; whether
    path holds an interrupted evaluation with another key, one this evaluation replaces). No file, a
    finished evaluation or a file that does not parse: (None, False)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, False
    if not isinstance(record, dict) or record.get("complete") is not False:
        return None, False
    return (record, False) if record.get(KEY) == key else (None, True)


@dataclass
class PartialRecord:
    """An evaluation's record as it runs: the header (run, checkpoint, settings, key), the results
    of the lengths finished so far, and the planned stages not yet finished."""

    path: Path
    header: dict
    planned: list[Stage]                     # every stage, in order
    finished: list[str] = field(default_factory=list)  # the labels of those finished (StageLines.finished)
    results: dict = field(default_factory=dict)  # the evaluation's summary part so far

    @property
    def missing(self) -> list[str]:
        return [s.label for s in self.planned if s.label not in self.finished]

    def write(self, extra: dict | None = None) -> dict:
        """The record as it stands, written atomically; returns it."""
        record = {**self.header, "complete": not self.missing, "missing": self.missing,
                  **self.results, **(extra or {})}
        write_json_atomic(self.path, record)
        return record

    def stopped(self, command: str) -> EvaluationInterrupted:
        """The one line a Ctrl-C ends with: what the file holds, what it lacks, how to finish it."""
        done = [s for s in self.planned if s.label in self.finished]
        left = [s for s in self.planned if s.label not in self.finished]
        holds = f"{self.path} keeps {in_words(done)}" if done else f"no length had finished ({self.path} says so)"
        return EvaluationInterrupted(f"stopped by Ctrl-C: {holds}; missing {in_words(left)} — run `{command}` again "
                                     f"to score only what is missing")
