"""Finished runs on disk, grouped by what differs between them, seeds aggregated.

Each run is read through its RunDir (posenc/record/rundir.py), each file once: the composed config,
the overrides (what the user changed), the metrics and the summary. What a sweep varied is read
from the overrides (``encoding=rope``, ``encoding.base=100``): exactly the keys the user
swept, in the user's own words. ``seed`` is never a group key: seeds are what gets averaged.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posenc.config import parse_overrides
from posenc.errors import UserError
from posenc.record.directory import missing_path
from posenc.record.rundir import HYDRA_DIR, METRICS_FILE, RunDir
from posenc.report.format import format_value
from posenc.report.stats import Stat, aggregate, scale_of

#: overrides that never define a group: seeds are aggregated, the rest is bookkeeping
NOT_A_GROUP_KEY = {"seed", "experiment", "name", "device", "check", "logger", "logger.mode", "logger.group",
                   "logger.tags", "trainer.resume", "trainer.compile",
                   "trainer.init_from"}  # each seed of a fine-tune sweep has its own parent: not a group

#: config keys that say where or how a run was made, not what was trained: two runs that differ
#: only in these are the same experiment (a re-run, a resumed copy) and are counted once
RUN_SPECIFIC = ("name", "device", "check", "experiment", "logger.", "bench.", "hydra.", "trainer.resume", "trainer.compile",
                "trainer.log_interval", "trainer.checkpoint_interval")
RUN_SPECIFIC_WORDS = {"path", "paths", "dir", "dirs", "resume"}  # words of a key's last part: run_dir, resume_from


@dataclass
class Run:
    path: Path
    config: dict[str, Any]           # flattened: {"encoding.base": 10000, ...}
    overrides: dict[str, str]        # {"encoding": "rope", "seed": "0"}
    summary: dict[str, Any] | None
    rows: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        """completed | failed | unfinished (no summary yet: still running, or killed)."""
        if self.summary is None:
            return "unfinished"
        return str(self.summary.get("status", "completed"))

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @property
    def seed(self) -> Any:
        return self.config.get("seed", self.overrides.get("seed"))

    def identity(self) -> str:
        """What was trained: the flattened config without the run-specific keys (seed included)."""
        kept = {k: v for k, v in self.config.items() if not is_run_specific(k)}
        return json.dumps(kept, sort_keys=True, default=str)

    def metric(self, key: str) -> Any:
        return (self.summary or {}).get(key)

    def value(self, key: str) -> Any:
        """A grouping key's value: the override as typed, else the config's (a group
        name like `encoding` reads `encoding.name`)."""
        if key in self.overrides:
            value = _parse_scalar(self.overrides[key])
        elif key in self.config:
            value = self.config[key]
        else:
            value = self.config.get(f"{key}.name")
        # 10000 typed and 10000.0 composed are one value
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


@dataclass
class Group:
    key: tuple                        # the by-keys' values
    label: str
    runs: list[Run]
    by: tuple[str, ...] = ()          # the by-keys: what a figure's legend lists the groups by

    @property
    def completed(self) -> list[Run]:
        """The finished runs, in seed order."""
        return sorted((r for r in self.runs if r.ok), key=lambda r: sort_key(r.seed))

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if not r.ok]

    def values(self, key: str) -> list:
        """A summary key over the completed seeds in seed order (None where a seed lacks it)."""
        return [r.metric(key) for r in self.completed]

    def stat(self, key: str) -> Stat:
        """The key over the completed seeds, averaged on its metric's scale (report/stats.py)."""
        return aggregate(self.values(key), scale_of(key))

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.completed]


def find_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run directory at or under each path (a run, a sweep, or a folder of sweeps)."""
    dirs: dict[Path, RunDir] = {}  # a run given twice (itself and its sweep) is read once
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UserError(missing_path(path, "give a run directory or a sweep directory under outputs/"))
        found = [RunDir(path)] if RunDir(path).is_run() else RunDir.under(path)
        if not found:
            raise UserError(f"no runs under {path} — a run directory holds {HYDRA_DIR}/ and {METRICS_FILE}")
        dirs.update((d.path, d) for d in found if d.path not in dirs)
    return [load_run(d) for d in dirs.values()]


def is_run_specific(key: str) -> bool:
    return (key in RUN_SPECIFIC or f"{key.split('.')[0]}." in RUN_SPECIFIC
            or not RUN_SPECIFIC_WORDS.isdisjoint(key.split(".")[-1].split("_")))


def _status_rank(run: Run) -> int:
    return {"completed": 2, "failed": 1}.get(run.status, 0)


def _age(run: Run) -> float:
    """When the run last wrote anything (summary, else metrics, else its config)."""
    return RunDir(run.path).last_written()


def deduplicate(runs: Sequence[Run]) -> tuple[list[Run], list[tuple[Run, list[Run]]]]:
    """One run per (config, seed): a re-run or a copied run directory would count its seed twice
    and shrink the interval. Keeps the finished one, and among those the newest.
    Returns (runs kept, in their order; [(kept, [dropped, ...]) per duplicated config])."""
    by_identity: dict[str, list[Run]] = {}
    for run in runs:
        by_identity.setdefault(run.identity(), []).append(run)
    kept, duplicates = [], []
    for same in by_identity.values():
        best = max(same, key=lambda r: (_status_rank(r), _age(r), str(r.path)))
        kept.append(best)
        if len(same) > 1:
            duplicates.append((best, [r for r in same if r is not best]))
    keep = {id(r) for r in kept}
    return [r for r in runs if id(r) in keep], duplicates


def group_keys(runs: Sequence[Run]) -> list[str]:
    """Every key --by accepts for these runs: config keys, overrides, and config groups
    (`encoding` for `encoding.name`)."""
    keys = {k for r in runs for k in r.config} | {k for r in runs for k in r.overrides}
    keys |= {k.removesuffix(".name") for k in keys if k.endswith(".name")}
    return sorted(k for k in keys if not k.endswith("._target_"))  # a class path: its group's name says it


def check_choice(what: str, given: str, valid: Sequence[str], prefer: Sequence[str] = (),
                 shown: int | None = None) -> None:
    """Refuse a value that is not one of valid, naming the closest matches first, then the
    preferred ones (e.g. the keys the sweep varied), at most `shown` of them and how many more."""
    if given in valid:
        return
    close = difflib.get_close_matches(given, valid, n=3, cutoff=0.5)
    ordered = list(dict.fromkeys([*close, *(p for p in prefer if p in valid), *valid]))
    shown = shown or len(ordered)
    more = f" (and {len(ordered) - shown} more)" if len(ordered) > shown else ""
    raise UserError(f"{what} {given!r} is not in these runs — use one of: {', '.join(ordered[:shown])}{more}")


def load_config(conf: DictConfig) -> dict[str, Any]:
    """A run's composed config flattened to dotted keys, its interpolations resolved
    (`encoding.max_len=${trainer.seq_len}` reads 32) where they can be outside Hydra (a
    `${hydra:...}` resolver cannot: kept as written)."""
    flat = flatten(OmegaConf.to_container(conf, resolve=False))
    for key, value in flat.items():
        if isinstance(value, str) and "${" in value:
            try:
                flat[key] = OmegaConf.select(conf, key)
            except OmegaConfBaseException:
                pass
    return flat


def load_run(run: RunDir | Path) -> Run:
    """A run as its RunDir reads it: config, overrides, summary and metrics, each file once."""
    run = RunDir.of(run)
    overrides = {}
    for key, value, o in parse_overrides(run.overrides()):
        overrides[key] = value if isinstance(value, str) else o.get_value_element_as_str()
    return Run(run.path, load_config(run.saved_config()), overrides, run.summary(), run.metrics())


def flatten(node: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def varying_keys(runs: Sequence[Run]) -> list[str]:
    """The overridden keys whose value differs between runs, in the order first typed."""
    keys: list[str] = []
    for run in runs:
        keys.extend(k for k in run.overrides if k not in keys and k not in NOT_A_GROUP_KEY)
    return [k for k in keys if len({repr(r.value(k)) for r in runs}) > 1]


def group_runs(runs: Sequence[Run], by: Sequence[str]) -> list[Group]:
    """One group per combination of the by-keys' values, sorted by those values."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.value(k) for k in by), []).append(run)
    ordered = sorted(groups.items(), key=lambda item: tuple(sort_key(v) for v in item[0]))
    return [Group(key, group_label(by, key), members, tuple(by)) for key, members in ordered]


def group_label(by: Sequence[str], values: tuple) -> str:
    if not by:
        return "all runs"
    if len(by) == 1:
        return format_value(values[0])
    return ", ".join(f"{short_key(k)}={format_value(v)}" for k, v in zip(by, values))


def short_key(key: str) -> str:
    """A by-key as a label shows it: its last part (trainer.seq_len -> seq_len), but a config
    group's name as the group, as the user chose it (layout.name -> layout, as in layout=hybrid;
    "name=rope, name=hybrid" would not say which is which)."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def _parse_scalar(text: str) -> Any:
    """An override's value as YAML reads it: '100' -> 100.0, '1e6' -> 1000000.0, 'rope' -> 'rope'."""
    try:
        return float(text)
    except ValueError:
        return {"true": True, "false": False, "null": None}.get(text.lower(), text)


def sort_key(value: Any) -> tuple:
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (1, 0.0, str(value))
