"""The shipped baselines: posenc/leaderboard/baselines/<protocol>.json, one row per shipped encoding
with every seed's value of every protocol metric, the resolved protocol and its hash, the versions
and the machine that measured them, and what `posenc check` found of the encoding (which version of
the checks, which properties fail). Written only by `posenc leaderboard --regenerate` (everything)
and `--recheck` (the check records alone: the checks take seconds, the runs hours), but a row's ``note``:
written by hand where the code changed since the row was measured in a way its numbers do not show
(kept by --recheck, dropped by --regenerate, which measures the code as it is).
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path

from posenc.errors import UserError
from posenc.leaderboard.protocol import Protocol


@dataclass(frozen=True)
class Row:
    """One encoding under the protocol: per-seed values of each metric (None where the encoding
    has no such value, e.g. learned positions past their table), seconds per run, failures."""
    label: str
    values: dict[str, list[float | None]]
    wall_time_s: dict[str, list[float]] = field(default_factory=dict)   # arm -> per-seed run wall time
    load_1m: list[float] = field(default_factory=list)                 # the machine's load when each run ended
    errors: list[str] = field(default_factory=list)
    check: dict | None = None  # `posenc check` of the encoding: {"version", "failed": [property, ...][, "caveats"]}
    kernels: dict[str, list[str]] = field(default_factory=dict)  # arm -> per-seed kernel paths and fallbacks
    note: str = ""             # what a reader of the row must know that its numbers do not say (shown beside it)


def baselines_path(protocol: Protocol) -> Path:
    """Where a protocol's baselines are kept: a shipped protocol's in the package (inside the source
    tree of an editable install), one given as a YAML file's beside it (<file>.json)."""
    if protocol.source.endswith((".yaml", ".yml")):
        return Path(protocol.source).with_suffix(".json")
    return Path(str(files("posenc.leaderboard").joinpath("baselines", f"{protocol.name}.json")))


def versions() -> dict[str, str]:
    import torch

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "unknown"

    return {"posenc": of("posenc"), "torch": torch.__version__, "python": platform.python_version(),
            "numpy": of("numpy")}


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, object]:
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpus": cpus, "python": sys.version.split()[0]}


def row_to_json(row: Row) -> dict:
    out = {"values": row.values, "wall_time_s": row.wall_time_s, "load_1m": row.load_1m, "errors": row.errors}
    if row.kernels:  # how each seed's runs ran (posenc/record/kernel_record.py: brief)
        out["kernels"] = row.kernels
    out = {**out, "check": row.check} if row.check is not None else out
    return {**out, "note": row.note} if row.note else out


def document(protocol_config: dict, protocol_hash: str, description: str, rows: list[Row], command: str) -> dict:
    """The shipped file's content."""
    return {"protocol": {"name": protocol_config["name"], "hash": protocol_hash, "description": description,
                         "config": protocol_config},
            "command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "versions": versions(), "machine": machine(),
            "rows": {row.label: row_to_json(row) for row in rows}}


@dataclass(frozen=True)
class Baselines:
    protocol: str
    hash: str
    rows: list[Row]
    raw: dict          # the whole file, for the page and the provenance lines


def load_baselines(protocol: Protocol) -> Baselines:
    path = baselines_path(protocol)
    if not path.is_file():
        raise UserError(f"no shipped baselines for protocol '{protocol.name}' at {path} — "
                        f"run `posenc leaderboard --regenerate` to measure them")
    raw = json.loads(path.read_text())
    rows = [Row(label, r["values"], r.get("wall_time_s", {}), r.get("load_1m", []), r.get("errors", []), r.get("check"),
                r.get("kernels", {}), r.get("note", "")) for label, r in raw["rows"].items()]
    return Baselines(raw["protocol"]["name"], raw["protocol"]["hash"], rows, raw)
