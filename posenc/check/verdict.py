"""The verdict of `posenc check` that every command carries: `posenc train` (each run, each sweep job),
`eval`, `probe` and `compare` ask whether the encoding they run keeps the contract, and an encoding
that does not is said in one ``warning:`` line naming the rows, recorded in the run (summary.json,
W&B, eval.json) and marked where runs are compared.

A verdict is the CPU rows of `posenc check` (every group but the CUDA rows, in evaluation and in
training: seconds) on the check's tiny model built from the run's encoding, layout and model (its
shape set to the check's: ``subject.SHAPE``), the precision rows in the run's training precision.
It is keyed by everything that decides it (posenc/check/identity.py, ``key_of``): the code on the
check's whole path — posenc's model, masks, attention paths, recurrences, training step and checks —
the encoding's own code, its configs, the training precision, the positions measured and the
versions of torch, triton and flash-linear-attention,

so that a verdict is never carried to code it did not measure: a change anywhere on that path (a
future leak in posenc/nn/dense.py) is another key, measured again. It is measured at most once per
key, and found again by every later run, sweep job, eval and probe:

1. posenc's own encodings and layouts ship theirs, in fp32 and in bf16 (posenc/check/shipped.json,
   written by `posenc check --write-shipped`; tests/test_verdicts.py measures every entry again and
   compares): a built-in run never pays the check;
2. the rest are measured once and kept in ``$POSENC_CHECK_CACHE``, else ``$POSENC_CACHE/check``, else
   ``~/.cache/posenc/check`` (where posenc keeps its packed corpora), one JSON file per key. Jobs of a
   sweep that ask for the same key at once take a lock on it (``filelock``, held until the holder
   finishes or dies): one measures, the others wait and read its file; each file is written whole
   (a temporary file of its own, renamed), so a reader never sees half of one.

A measurement runs in the command's process with its random state, warnings and threads restored
afterwards, so a run that measured is the run that did not have to (the same initialisation). The
lookup is turned off with ``check=false`` (`posenc train`) or ``--no-check`` (`eval`, `probe`,
`compare`). A lookup that cannot run says so in its warning and records ``"from": "error"``; it never
stops the command. A warning names the encoding as the run configured it: its name and the options
where it differs from its config file (``rope scaling=dynamic scaling_factor=4``: ``variant``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from filelock import FileLock
from omegaconf import DictConfig, OmegaConf

from posenc.check.identity import check_command, key_of, variant
from posenc.check.subject import SHAPE, Subject, training_precision
from posenc.record.directory import write_json_atomic

CACHE_ENV = "POSENC_CHECK_CACHE"
#: the check groups a verdict runs: all but these (runner.CHECKS's names)
LEFT_OUT = ("CUDA",)


@dataclass(frozen=True)
class Verdict:
    """What `posenc check` says of one encoding's code and config. source: ``shipped``, ``cache``,
    ``measured`` (here, now), ``off`` (not asked) or ``error`` (could not be measured: ``error``)."""

    key: str
    failed: tuple[str, ...]
    source: str
    seconds: float | None = None
    where: str | None = None
    error: str | None = None
    precision: str | None = None

    @property
    def holds(self) -> bool | None:
        return None if self.source in ("off", "error") else not self.failed

    def record(self) -> dict:
        """What summary.json and eval.json keep."""
        out = {"holds": self.holds, "failed": list(self.failed), "from": self.source, "key": self.key}
        if self.precision is not None:
            out["precision"] = self.precision
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 2)
        if self.error:
            out["error"] = self.error
        return out

    def warning(self, name: str, command: str | None = None) -> str | None:
        """The one line a failing (or unmeasurable) encoding gets, or None. name: the encoding as
        configured (``variant``); command: the `posenc check` that shows every row."""
        if self.source == "error":
            return f"posenc check could not measure encoding '{name}' ({self.error}): its results carry no verdict"
        if not self.failed:
            return None
        why = f"every row as measured: {self.where}" if self.where else \
            f"`{command or 'posenc check encoding=' + name}` shows every row"
        return (f"encoding '{name}' fails posenc check ({'; '.join(self.failed)}): results measured with it are not "
                f"about positional encoding alone — {why}")


def subject_config(cfg: DictConfig) -> DictConfig:
    """The run's config on the check's tiny shape (subject.SHAPE), as `posenc check` composes it; its
    window, positions and precision are the Subject's (``Subject.of``)."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_readonly(out, False)
    for item in SHAPE:
        key, _, value = item.partition("=")
        OmegaConf.update(out, key, json.loads(value), merge=False)
    return out


def cache_dir() -> Path:
    """$POSENC_CHECK_CACHE, else the check/ folder of posenc's cache (posenc/data/packing.py)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    from posenc.data.packing import cache_root  # start-up: the data package loads numpy and torch

    return cache_root() / "check"


def shipped() -> dict[str, dict]:
    """The verdicts posenc ships, by key (posenc/check/shipped.json)."""
    path = files("posenc.check").joinpath("shipped.json")
    if not path.is_file():
        return {}
    return {entry["key"]: entry for entry in json.loads(path.read_text())["verdicts"].values()}


def lookup(cfg: DictConfig, enabled: bool = True) -> Verdict:
    """The verdict of the encoding cfg runs: shipped, cached, or measured now (and cached). Never
    raises: a verdict that cannot be had is ``error``, saying why."""
    if not enabled:
        return Verdict("", (), "off")
    try:
        key = key_of(cfg)
        entry = shipped().get(key)
        if entry is not None:
            return Verdict(key, tuple(entry["failed"]), "shipped", precision=training_precision(cfg))
        return cached_or_measured(cfg, key)
    except Exception as e:  # noqa: BLE001 - a verdict is a warning's matter, never a reason to stop the command
        return Verdict("", (), "error", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])


def cached_or_measured(cfg: DictConfig, key: str) -> Verdict:
    """The cache's verdict for key; else measured once (under the key's lock) and written there."""
    folder = cache_dir()
    path = folder / f"{key}.json"
    found = read(path, key)
    if found is not None:
        return found
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # no cache to write (a read-only home): measured, not kept
        return measure(cfg, key)[0]
    # another job measuring this key holds the lock until it has written the file (or has died: the
    # operating system releases its lock), so waiting for it is never longer than measuring
    with FileLock(folder / f"{key}.lock"):
        found = read(path, key)  # another job measured it while this one waited
        if found is not None:
            return found
        verdict, rows = measure(cfg, key)
        write_json_atomic(path, {"key": key, "failed": list(verdict.failed), "seconds": verdict.seconds,
                                 "precision": verdict.precision,
                                 "encoding": OmegaConf.to_container(cfg.encoding, resolve=False),
                                 "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows})
    return Verdict(key, verdict.failed, "measured", verdict.seconds, str(path), precision=verdict.precision)


def read(path: Path, key: str) -> Verdict | None:
    """The cached verdict at path, or None (absent, or unreadable: measured again)."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Verdict(key, tuple(entry["failed"]), "cache", entry.get("seconds"), str(path),
                   precision=entry.get("precision"))


def measure(cfg: DictConfig, key: str) -> tuple[Verdict, list[dict]]:
    """The CPU rows of `posenc check` on cfg's encoding, in this process, its state left as it was."""
    from posenc.check.runner import CHECKS, run_checks  # start-up: the checks import torch
    from posenc.check.subject import forward

    from posenc.train.distributed import alone

    started = time.perf_counter()
    with isolated(), alone():  # on rank 0 of a run on several ranks: this process's model, no collective
        subject = Subject.of(subject_config(cfg))
        # a config the check cannot build a model from, or whose model cannot run the check's window
        # (learned's max_len below it, a run that will refuse its own first step too), is no verdict on
        # the encoding: it raises, and the lookup says it could not measure
        forward(subject.model(), subject.tokens())
        rows = run_checks(subject, only={what for what, _ in CHECKS if what not in LEFT_OUT})
    seconds = time.perf_counter() - started
    failed = tuple(r.name for r in rows if r.failed)
    return Verdict(key, failed, "measured", seconds, precision=subject.precision), [
        {"name": r.name, "status": r.status.value, "measured": r.measured, "note": r.note} for r in rows]


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """torch's, numpy's and Python's random state, the warnings shown and posenc's said-once
    warnings, as they were before: the command goes on as if nothing had been measured."""
    import numpy as np
    import torch

    from posenc import errors

    said, py, npr = set(errors._WARNED), random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            errors._WARNED.clear()
            errors._WARNED.update(said)
            random.setstate(py)
            np.random.set_state(npr)


def announce(verdict: Verdict, cfg: DictConfig) -> dict:
    """verdict's warning line, where it has one, naming cfg's encoding as configured (said once per
    process: a sweep's seeds share it); its record."""
    line = verdict.warning(variant(cfg), check_command(cfg))
    if line is not None:
        from posenc.errors import warn_once

        warn_once(line)
    return verdict.record()


def carried(cfg: DictConfig, enabled: bool = True) -> dict:
    """What a command does with the verdict of the encoding cfg runs: said (one warning: line where
    it fails) and returned for the run's record."""
    return announce(lookup(cfg, enabled), cfg)
