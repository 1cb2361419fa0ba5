"""The verdict of `posenc check` that every command carries: `posenc train` (each run, each sweep job),
`eval`, `probe` and `compare` ask whether the encoding they run keeps the contract, and an encoding
that does not is said in one ``warning:`` line naming the rows, recorded in the run (summary.json,
W&B, eval.json) and marked where runs are compared.

A verdict is the CPU rows of `posenc check` (every group but the CUDA rows, in evaluation and in
training: seconds) on the check's tiny model built from the run's encoding, layout and model (its
shape set to the check's: ``subject.SHAPE``), the precision rows in the run's training precision.
It is keyed by everything that decides it (``key_of``):

- the code the check's model, masks, attention paths, recurrences, training step and checks run:
  every posenc module importing posenc/check/runner.py, posenc/build.py and posenc/train/state.py
  runs (posenc/record/imports.py, read from the source, function-level imports included), each as
  code (posenc/record/code.py: a comment is no change) — the CUDA rows (cuda.py) and this module
  and shipped.py aside (``path_digest``);
- the code of the encoding's classes, as provenance hashes it (posenc/record/provenance.py: every
  module of the plug-in and of posenc that the class imports);
- the encoding, layout and model configs (the shape aside), as written (a different ``encoding.base``
  is another encoding; a different learning rate or data the same one), the window measured in
  (``check_length``: the check's 24 tokens, or the run's length when shorter), the run's training
  precision (trainer.precision resolved: fp32, bf16, fp16) and the positions the precision rows
  reach (``subject.measured_positions``: the run's evaluation's, at least 4096);
- the versions of torch, triton and flash-linear-attention (``library_versions``: "absent" where
  not installed): what they compute changes with them (torch 2.15's clamp moved PoPE's rows);

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
import hashlib
import json
import os
import random
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path

from filelock import FileLock
from omegaconf import DictConfig, OmegaConf

from posenc.check.subject import SHAPE, Subject, check_length, measured_positions, training_precision
from posenc.config.catalogue import encoding_options
from posenc.errors import UserError
from posenc.record.code import code_of
from posenc.record.directory import plain_number, write_json_atomic
from posenc.record.imports import package_sources
from posenc.record.provenance import code_record, encoding_targets, posenc_root

CACHE_ENV = "POSENC_CHECK_CACHE"
#: the check groups a verdict runs: all but these (runner.CHECKS's names)
LEFT_OUT = ("CUDA",)
#: where the path a verdict is about starts: what importing these runs is what the check runs
PATH_MODULES = ("posenc.check.runner", "posenc.build", "posenc.train.state")
#: posenc's modules on that path whose code does not decide a verdict (the CUDA rows are left out)
NOT_ON_THE_PATH = ("posenc/check/verdict.py", "posenc/check/shipped.py", "posenc/check/cuda.py")
#: the libraries whose versions decide a verdict: name in the key -> its distributions, first installed
LIBRARIES = {"torch": ("torch",), "triton": ("triton", "pytorch-triton"),
             "fla": ("flash-linear-attention", "fla-core")}
#: model keys the check sets itself (SHAPE): not part of what a verdict is about
SHAPE_KEYS = ("n_layer", "n_head", "d_model", "dropout")


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


def canonical(node: object) -> object:
    """A config as plain data with one spelling per value (10000 and 10000.0 alike)."""
    if isinstance(node, dict):
        return {str(k): canonical(v) for k, v in sorted(node.items(), key=lambda kv: str(kv[0]))}
    if isinstance(node, list):
        return [canonical(v) for v in node]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    return node


def path_files() -> dict[str, Path]:
    """Every posenc module on the check's path: what importing PATH_MODULES runs within posenc
    (NOT_ON_THE_PATH aside), by its name under posenc's root."""
    root = posenc_root()
    found = {str(p.resolve().relative_to(root)): p for module in PATH_MODULES for p in package_sources(module, root)}
    return {name: found[name] for name in sorted(found) if name not in NOT_ON_THE_PATH}


def path_digest() -> str:
    """The code of every module on the check's path (``path_files``), each as code."""
    return hashlib.sha256("\n".join(f"{name}:{code_of(p)[0]}" for name, p in path_files().items()).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    """{torch, triton, fla: the installed version, or "absent"} (importlib.metadata, nothing imported)."""
    out = {}
    for name, distributions in LIBRARIES.items():
        out[name] = "absent"
        for distribution in distributions:
            try:
                out[name] = version(distribution)
                break
            except PackageNotFoundError:
                continue
    return out


def key_of(cfg: DictConfig) -> str:
    """What decides a verdict, hashed (the module doc): 32 hex digits."""
    model = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=False).items() if k not in SHAPE_KEYS}
    what = {"path": path_digest(),
            "code": {target: code_record(target)["sha256"] for target in encoding_targets(cfg)},
            "encoding": OmegaConf.to_container(cfg.encoding, resolve=False),
            "layout": OmegaConf.to_container(cfg.layout, resolve=False), "model": model, "T": check_length(cfg),
            "precision": training_precision(cfg), "positions": measured_positions(cfg),
            "libraries": library_versions()}
    return hashlib.sha256(json.dumps(canonical(what), sort_keys=True, default=str).encode()).hexdigest()[:32]


def subject_config(cfg: DictConfig) -> DictConfig:
    """The run's config on the check's tiny shape (subject.SHAPE), as `posenc check` composes it; its
    window, positions and precision are the Subject's (``Subject.of``)."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_readonly(out, False)
    for item in SHAPE:
        key, _, value = item.partition("=")
        OmegaConf.update(out, key, json.loads(value), merge=False)
    return out


def variant(cfg: DictConfig) -> str:
    """The encoding as the run configured it: its name, and each option where cfg differs from its
    config file (an encoding it wraps by that one's name): 'rope scaling=dynamic scaling_factor=4'."""
    encoding = OmegaConf.to_container(cfg.encoding, resolve=False)
    name = str(encoding.get("name", "?"))
    try:
        defaults = encoding_options(name)
    except UserError:  # no config file of that name (a config built by hand): the name alone
        return name
    changed = []
    for key, value in encoding.items():
        if key in ("_target_", "name"):
            continue
        if isinstance(value, dict):
            if value.get("name") != defaults.get(key):
                changed.append(f"{key}={value.get('name')}")
        elif key not in defaults or canonical(value) != canonical(defaults[key]):
            changed.append(f"{key}={plain_number(value)}")
    return " ".join([name, *changed])


def check_command(cfg: DictConfig) -> str:
    """The `posenc check` that shows every row of cfg's verdict."""
    encoding = OmegaConf.to_container(cfg.encoding, resolve=False)
    parts = [f"encoding={encoding.get('name', '?')}"]
    for item in variant(cfg).split(" ")[1:]:
        key, _, value = item.partition("=")
        parts.append(f"encoding@encoding.{key}={value}" if isinstance(encoding.get(key), dict)
                     else f"encoding.{key}={value}")
    precision = training_precision(cfg)
    if precision != "fp32":
        parts.append(f"trainer.precision={precision}")
    return "posenc check " + " ".join(parts)


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

    started = time.perf_counter()
    with isolated():
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
