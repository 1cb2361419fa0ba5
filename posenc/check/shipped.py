"""The verdicts posenc ships: `posenc check`'s CPU rows on every encoding posenc ships (conf/encoding/,
on the uniform layout) and every layout (conf/layout/, with the default encoding), each in fp32 and in
bf16 (the default precisions on a CPU and on a GPU), kept in posenc/check/shipped.json under the key
each is found by (posenc/check/verdict.py), so that a run of a built-in encoding carries its verdict
without measuring it.

`posenc check --write-shipped` measures them all again and rewrites the file (a minute or two on a
CPU); tests/test_verdicts.py measures every entry again (``measured``, as this writes it) and compares
it with the file. The float64 rows do not depend on the precision, so each entry measures them once
and the precision rows in each of PRECISIONS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from omegaconf import DictConfig

from posenc.check.verdict import LEFT_OUT, isolated, key_of, subject_config
from posenc.config import compose
from posenc.config.searchpath import CONFIG_MODULE
from posenc.record.directory import write_json_atomic

COMMAND = "posenc check --write-shipped"
#: the training precisions every entry ships a verdict in
PRECISIONS = ("fp32", "bf16")
#: the group of properties measured in the run's precision (runner.CHECKS's name)
PRECISION_GROUP = "precision"


def shipped_path() -> Path:
    """posenc/check/shipped.json (in the source tree of an editable install)."""
    return Path(str(files("posenc.check").joinpath("shipped.json")))


def own_options(group: str) -> list[str]:
    """posenc's own options of a config group (not a plug-in's), sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in files(CONFIG_MODULE).joinpath(group).iterdir()
                  if p.name.endswith(".yaml"))


def entries() -> dict[str, list[str]]:
    """What ships a verdict, as the overrides that compose it: each encoding, each other layout."""
    out = {f"encoding={name}": [f"encoding={name}"] for name in own_options("encoding")}
    out.update({f"layout={name}": [f"layout={name}"] for name in own_options("layout") if name != "uniform"})
    return out


def label(entry: str, precision: str) -> str:
    """An entry's name in shipped.json in one precision: 'encoding=rope trainer.precision=bf16'."""
    return f"{entry} trainer.precision={precision}"


def measured(overrides: list[str]) -> dict[str, dict]:
    """One entry measured in each of PRECISIONS: {label's precision: {key, failed, seconds}}, the
    float64 rows measured once (they do not depend on the precision)."""
    from posenc.check.runner import CHECKS, run_checks  # start-up: the checks import torch
    from posenc.check.subject import Subject

    out = {}
    started = time.perf_counter()
    with isolated():
        configs = {p: compose([*overrides, f"trainer.precision={p}"], bench=False) for p in PRECISIONS}
        subjects = {p: Subject.of(subject_config(cfg)) for p, cfg in configs.items()}
        shared = run_checks(subjects[PRECISIONS[0]], only={what for what, _ in CHECKS
                                                             if what not in (*LEFT_OUT, PRECISION_GROUP)})
        common = time.perf_counter() - started
        for p, subject in subjects.items():
            began = time.perf_counter()
            rows = [*shared, *run_checks(subject, only={PRECISION_GROUP})]
            out[p] = entry_record(configs[p], rows, common + time.perf_counter() - began)
    return out


def entry_record(cfg: DictConfig, rows: list, seconds: float) -> dict:
    """What shipped.json keeps of one verdict."""
    return {"key": key_of(cfg), "failed": [r.name for r in rows if r.failed], "seconds": round(seconds, 2)}


def write_shipped(say: Callable[[str], None]) -> Path:
    """Measure every entry and write shipped.json; say(line) hears each entry's result."""
    verdicts, started = {}, time.perf_counter()
    for entry, overrides in entries().items():
        for precision, record in measured(overrides).items():
            verdicts[label(entry, precision)] = record
            failed = record["failed"]
            say(f"{label(entry, precision)}: {'✓' if not failed else '✗ ' + '; '.join(failed)} "
                f"({record['seconds']:.1f} s)")
    path = shipped_path()
    write_json_atomic(path, {"written_by": COMMAND, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                             "verdicts": verdicts})
    say(f"wrote {path} ({len(verdicts)} verdicts, {time.perf_counter() - started:.0f} s)")
    return path
