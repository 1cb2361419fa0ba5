"""The verdicts posenc ships: `posenc check`'s CPU rows on every encoding posenc ships (conf/encoding/,
on the uniform layout) and every layout (conf/layout/, with the default encoding), kept in
posenc/check/shipped.json under the key each is found by (posenc/check/verdict.py), so that a run of a
built-in encoding carries its verdict without measuring it.

`posenc check --write-shipped` measures them all again and rewrites the file (a few minutes on a
CPU); tests/test_verdicts.py holds the file to the code: every entry keyed to the code and configs
of today, every encoding and layout there, and every one of them passing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from posenc.check.verdict import key_of, measure
from posenc.config import compose
from posenc.config.searchpath import CONFIG_MODULE
from posenc.record.directory import write_json_atomic

COMMAND = "posenc check --write-shipped"


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


def write_shipped(say: Callable[[str], None]) -> Path:
    """Measure every entry and write shipped.json; say(line) hears each entry's result."""
    verdicts, started = {}, time.perf_counter()
    for label, overrides in entries().items():
        cfg = compose(overrides, bench=False)
        key = key_of(cfg)
        verdict, _ = measure(cfg, key)
        verdicts[label] = {"key": key, "failed": list(verdict.failed), "seconds": round(verdict.seconds or 0.0, 2)}
        say(f"{label}: {'✓' if not verdict.failed else '✗ ' + '; '.join(verdict.failed)} ({verdict.seconds:.1f} s)")
    path = shipped_path()
    write_json_atomic(path, {"written_by": COMMAND, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                             "verdicts": verdicts})
    say(f"wrote {path} ({len(verdicts)} verdicts, {time.perf_counter() - started:.0f} s)")
    return path
