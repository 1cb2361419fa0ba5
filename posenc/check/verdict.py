"""The verdict of `posenc check` that every command carries: `posenc train` (each run, each sweep job),
`eval`, `probe` and `compare` ask whether the encoding they run keeps the contract, and an encoding
that does not is said in one ``warning:`` line naming the rows, recorded in the run (summary.json,
W&B, eval.json) and marked where runs are compared.

A verdict is the CPU rows of `posenc check` (every group but the CUDA rows, in evaluation and in
training: seconds) on the check's tiny model built from the run's encoding, layout and model (its
shape set to the check's: ``subject.SHAPE``). It is keyed by what decides it (``key_of``):

- the code of the encoding's classes, as provenance hashes it (posenc/record/provenance.py: every
  module of the plug-in and of posenc that the class imports, as code, so a comment is no change);
- the encoding, layout and model configs (the shape aside), as written (a different ``encoding.base``
  is another encoding; a different learning rate, data or length is the same one), and the window
  measured in (``check_length``: the check's 24 tokens, or the run's length when shorter);
- the checks' own code (posenc/check/, as code; the CUDA rows and this module aside).

so it is measured at most once per version of that code and config, and found again by every later
run, sweep job, eval and probe:

1. posenc's own encodings and layouts ship theirs (posenc/check/shipped.json, written by `posenc check
   --write-shipped`; tests/test_verdicts.py holds it current): a built-in run never pays the check;
2. the rest are measured once and kept in ``$POSENC_CHECK_CACHE``, else ``$POSENC_CACHE/check``, else
   ``~/.cache/posenc/check`` (where posenc keeps its packed corpora), one JSON file per key. Jobs of a
   sweep that ask for the same key at once take a lock on it (``fcntl``): one measures, the others wait
   and read its file; each file is written whole (a rename), so a reader never sees half of one.

A measurement runs in the command's process with its random state, warnings and threads restored
afterwards, so a run that measured is the run that did not have to (the same initialisation). The
lookup is turned off with ``check=false`` (`posenc train`) or ``--no-check`` (`eval`, `probe`,
`compare`). A lookup that cannot run says so in its warning and records ``"from": "error"``; it never
stops the command.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.check.subject import SEQ_LEN, SHAPE
from posenc.record.code import code_of
from posenc.record.directory import write_json_atomic
from posenc.record.provenance import code_record, encoding_targets

CACHE_ENV = "POSENC_CHECK_CACHE"
#: the check groups a verdict runs: all but these (runner.CHECKS's names)
LEFT_OUT = ("CUDA",)
#: the checks' modules whose code does not decide a verdict
NOT_THE_CHECKS = ("verdict.py", "shipped.py", "cuda.py")
#: model keys the check sets itself (SHAPE): not part of what a verdict is about
SHAPE_KEYS = ("n_layer", "n_head", "d_model", "dropout")
#: how long a job waits for another measuring the same key before it measures itself
LOCK_WAIT_S = 600


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

    @property
    def holds(self) -> bool | None:
        return None if self.source in ("off", "error") else not self.failed

    def record(self) -> dict:
        """What summary.json and eval.json keep."""
        out = {"holds": self.holds, "failed": list(self.failed), "from": self.source, "key": self.key}
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 2)
        if self.error:
            out["error"] = self.error
        return out

    def warning(self, name: str) -> str | None:
        """The one line a failing (or unmeasurable) encoding gets, or None."""
        if self.source == "error":
            return f"posenc check could not measure encoding '{name}' ({self.error}): its results carry no verdict"
        if not self.failed:
            return None
        why = f"every row as measured: {self.where}" if self.where else \
            f"`posenc check encoding={name}` shows every row"
        return (f"encoding '{name}' fails posenc check ({'; '.join(self.failed)}): results measured with it are not "
                f"about positional encoding alone — {why}")


def canonical(node: object) -> object:
    """A config as plain data with one spelling per value (10000 and 10000.0 alike)."""
    if isinstance(node, dict):
        return {str(k): canonical(v) for k, v in sorted(node.items(), key=lambda kv: str(kv[0]))}
    if isinstance(node, list):
        return [canonical(v) for v in node]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    return node


def checks_digest() -> str:
    """The checks' own code: each module of posenc/check (NOT_THE_CHECKS aside) as code."""
    here = Path(__file__).parent
    parts = [f"{p.name}:{code_of(p)[0]}" for p in sorted(here.glob("*.py")) if p.name not in NOT_THE_CHECKS]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def key_of(cfg: DictConfig) -> str:
    """What decides a verdict, hashed (the module doc): 32 hex digits."""
    model = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=False).items() if k not in SHAPE_KEYS}
    what = {"checks": checks_digest(),
            "code": {target: code_record(target)["sha256"] for target in encoding_targets(cfg)},
            "encoding": OmegaConf.to_container(cfg.encoding, resolve=False),
            "layout": OmegaConf.to_container(cfg.layout, resolve=False), "model": model, "T": check_length(cfg)}
    return hashlib.sha256(json.dumps(canonical(what), sort_keys=True, default=str).encode()).hexdigest()[:32]


def check_length(cfg: DictConfig) -> int:
    """The window the check measures in: the check's own (subject.SHAPE), or the run's when shorter. A
    run's encoding may encode no more positions than it trains on (``encoding=learned
    encoding.max_len=16 trainer.seq_len=16``); measured at the check's length it would raise in every
    row and fail a contract it keeps."""
    return min(SEQ_LEN, int(cfg.trainer.seq_len))


def subject_config(cfg: DictConfig) -> DictConfig:
    """The run's config on the check's tiny shape (subject.SHAPE, the window ``check_length``), as
    `posenc check` composes it."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_readonly(out, False)
    length = check_length(cfg)
    for item in SHAPE:
        key, _, value = item.partition("=")
        OmegaConf.update(out, key, json.loads(value), merge=False)
    OmegaConf.update(out, "trainer.seq_len", length, merge=False)
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
            return Verdict(key, tuple(entry["failed"]), "shipped")
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
    with locked(folder / f"{key}.lock"):
        found = read(path, key)  # another job measured it while this one waited
        if found is not None:
            return found
        verdict, rows = measure(cfg, key)
        write_json_atomic(path, {"key": key, "failed": list(verdict.failed), "seconds": verdict.seconds,
                                 "encoding": OmegaConf.to_container(cfg.encoding, resolve=False),
                                 "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows})
    return Verdict(key, verdict.failed, "measured", verdict.seconds, str(path))


def read(path: Path, key: str) -> Verdict | None:
    """The cached verdict at path, or None (absent, or unreadable: measured again)."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Verdict(key, tuple(entry["failed"]), "cache", entry.get("seconds"), str(path))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on path (fcntl.flock) for the duration, waited for up to LOCK_WAIT_S; where
    the platform has none, or the wait runs out, no lock (two jobs then both measure: harmless)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    yield
                    return
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def measure(cfg: DictConfig, key: str) -> tuple[Verdict, list[dict]]:
    """The CPU rows of `posenc check` on cfg's encoding, in this process, its state left as it was."""
    from posenc.check.runner import CHECKS, run_checks  # start-up: the checks import torch
    from posenc.check.subject import Subject, forward

    started = time.perf_counter()
    with isolated():
        subject = Subject(subject_config(cfg))
        # a config the check cannot build a model from, or whose model cannot run the check's window
        # (learned's max_len below it, a run that will refuse its own first step too), is no verdict on
        # the encoding: it raises, and the lookup says it could not measure
        forward(subject.model(), subject.tokens())
        rows = run_checks(subject, only={what for what, _ in CHECKS if what not in LEFT_OUT})
    seconds = time.perf_counter() - started
    failed = tuple(r.name for r in rows if r.failed)
    return Verdict(key, failed, "measured", seconds), [
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


def announce(verdict: Verdict, name: str) -> dict:
    """verdict's warning line, where it has one (said once per process: a sweep's seeds share it);
    its record."""
    line = verdict.warning(name)
    if line is not None:
        from posenc.errors import warn_once

        warn_once(line)
    return verdict.record()


def carried(cfg: DictConfig, enabled: bool = True) -> dict:
    """What a command does with the verdict of the encoding cfg runs: said (one warning: line where
    it fails) and returned for the run's record."""
    return announce(lookup(cfg, enabled), str(cfg.encoding.get("name", "?")))

