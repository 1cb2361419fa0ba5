"""A benchmark protocol as data: posenc/leaderboard/<name>.yaml names its arms (each a Hydra
experiment, conf/experiment/<arm>.yaml), the seeds, the metrics each arm reports, and the
tolerance a re-run is held to. Its hash is taken over all of that and over each arm's config as
Hydra composes it, so a change to a default the arms inherit (the micro model, the trainer, the
evaluator, the corpus settings) changes the hash, and the shipped baselines no longer match it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from omegaconf import OmegaConf

from posenc.config import compose, parse_overrides
from posenc.errors import UserError
from posenc.report.stats import scale_of

DEFAULT_PROTOCOL = "posenc-pe-v2"
#: the keys of a composed arm that are not the protocol: what is benchmarked, which seed, where it logs
NOT_PROTOCOL = ("encoding", "seed", "logger")


@dataclass(frozen=True)
class Arm:
    name: str
    experiment: str                  # conf/experiment/<experiment>.yaml
    metrics: dict[str, str]          # summary key -> column label
    overrides: tuple[str, ...] = ()  # Hydra overrides after the experiment (a smaller test protocol)


SEED, MEAN = "seed", "mean"  # what a tolerance holds to: every seed's value, or the mean over the seeds


@dataclass(frozen=True)
class Tolerance:
    """How far a re-run's value of one metric may be from the shipped one and still reproduce it:
    relatively (a log-scale metric, perplexity) or absolutely (accuracy), seed by seed or on the
    mean over the seeds (a metric whose every seed is a fresh draw on another CPU: docs/leaderboard.md)."""
    value: float
    relative: bool
    over: str = SEED

    def __str__(self) -> str:
        kind = "relative" if self.relative else "absolute"
        return f"{kind} {self.value:g}" + (" on the mean over seeds" if self.over == MEAN else "")


@dataclass(frozen=True)
class Protocol:
    name: str
    description: str
    seeds: tuple[int, ...]
    arms: tuple[Arm, ...]
    tolerance: dict                  # as the protocol file writes it (hashed): see tolerance_of
    rationale: str = ""              # why these settings (markdown, on the leaderboard page; not hashed)
    source: str = DEFAULT_PROTOCOL   # what --protocol named: a shipped protocol's name or a YAML file
    encodings: tuple[str, ...] = ()  # the rows --regenerate measures; () = every encoding posenc ships (not hashed)

    @property
    def metrics(self) -> dict[str, str]:
        """Every arm's metrics, in order: summary key -> column label."""
        return {k: label for arm in self.arms for k, label in arm.metrics.items()}

    def metric_named(self, name: str) -> str:
        """The metric a user names: its summary key (extrapolation/ppl@1024), its column label
        (ppl 16×, or ppl 16x), or the key at a multiple of the training length as the label states
        it (extrapolation/ppl@16x); a name that is none of them refused, naming the closest."""
        aliases: dict[str, str] = {}
        for key, label in self.metrics.items():
            multiple = re.search(r"(\d+(?:\.\d+)?)×$", label)
            for alias in (key, label, label.replace("×", "x"),
                          f"{key.rsplit('@', 1)[0]}@{multiple[1]}x" if multiple else key):
                aliases[alias.lower()] = key
        found = aliases.get(name.strip().lower())
        if found is None:
            close = difflib.get_close_matches(name.lower(), list(aliases), n=3, cutoff=0.5)
            shown = list(dict.fromkeys([*close, *self.metrics]))
            raise UserError(f"--metric {name!r} is not one of {self.name}'s metrics — use one of: {', '.join(shown)} "
                            f"(or a column's label: {', '.join(self.metrics.values())})")
        return found

    def arm_of(self, metric: str) -> Arm:
        return next(arm for arm in self.arms if metric in arm.metrics)

    def tolerance_of(self, metric: str) -> Tolerance:
        """The metric's own entry (``tolerance: {metric: {relative|absolute: x, over: seed|mean}}``),
        else posenc-pe-v1's two numbers: ``relative`` for a log-scale metric, ``absolute`` for the
        others, seed by seed."""

        own = self.tolerance.get("metrics", {}).get(metric)
        if own is not None:
            relative = "relative" in own
            return Tolerance(float(own["relative" if relative else "absolute"]), relative, own.get("over", SEED))
        relative = scale_of(metric).log
        return Tolerance(float(self.tolerance["relative" if relative else "absolute"]), relative)


def protocol_file(name: str = DEFAULT_PROTOCOL) -> Path:
    """A shipped protocol's file (posenc/leaderboard/<name>.yaml), or a protocol kept elsewhere, given
    as a path to its YAML file (its baselines then live beside it, <file>.json)."""
    if name.endswith((".yaml", ".yml")):
        path = Path(name)
        if not path.is_file():
            raise UserError(f"--protocol {name}: no such file — give a protocol YAML file or a shipped protocol's name")
        return path
    path = Path(str(files("posenc.leaderboard").joinpath(f"{name}.yaml")))
    if not path.is_file():
        shipped = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise UserError(f"--protocol {name}: no such protocol — one of {', '.join(shipped)}, or a YAML file")
    return path


def load_protocol(name: str = DEFAULT_PROTOCOL) -> Protocol:
    raw = OmegaConf.to_container(OmegaConf.create(protocol_file(name).read_text()))
    arms = tuple(Arm(arm, spec["experiment"], dict(spec["metrics"]), tuple(spec.get("overrides") or ()))
                 for arm, spec in raw["arms"].items())
    return Protocol(raw["name"], " ".join(raw["description"].split()), tuple(raw["seeds"]), arms,
                    dict(raw["tolerance"]), raw.get("rationale", ""), name, tuple(raw.get("encodings") or ()))


def arm_config(arm: Arm) -> dict:
    """The arm's config as `posenc train experiment=<arm>` composes it from posenc's own conf/,
    resolved, without the keys that are not the protocol (NOT_PROTOCOL)."""

    cfg = OmegaConf.to_container(compose([f"experiment={arm.experiment}", *arm.overrides], bench=False), resolve=True)
    return {k: v for k, v in cfg.items() if k not in NOT_PROTOCOL}


def resolved(protocol: Protocol) -> dict:
    """What the hash covers: the protocol file's keys but its description and rationale, and each
    arm's composed config."""
    return {"name": protocol.name, "seeds": list(protocol.seeds), "tolerance": protocol.tolerance,
            "arms": {arm.name: {"experiment": arm.experiment, "metrics": arm.metrics, "config": arm_config(arm),
                                **({"overrides": list(arm.overrides)} if arm.overrides else {})}
                     for arm in protocol.arms}}


def as_recorded(current: dict, recorded: dict) -> tuple[dict, list[str]]:
    """The current resolved protocol cut to the keys a recorded one has, and the dotted keys added
    since. A config key posenc gained after the data was measured is not part of that protocol (a
    new key's default keeps the old behaviour: posenc's rule for new keys, and what --reproduce
    tests); a key whose value changed, or that is gone, still changes the hash."""
    added: list[str] = []

    def cut(now: object, then: object, where: str) -> object:
        if not (isinstance(now, dict) and isinstance(then, dict)):
            return now
        added.extend(f"{where}{k}" for k in now if k not in then)
        return {k: cut(now[k], then[k], f"{where}{k}.") for k in now if k in then}

    return cut(current, recorded, ""), added


def protocol_hash(config: dict) -> str:
    """sha256 of the resolved protocol as canonical JSON (sorted keys), first 16 hex digits."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encoding_overrides(args: list[str]) -> list[str]:
    """The overrides, checked to touch only the encoding: one error line for anything else."""
    if not args:
        raise UserError("name the encoding to benchmark: `posenc leaderboard encoding=NAME [encoding.KEY=…]` "
                        "(or --reproduce NAME, --regenerate)")
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise UserError(f"posenc leaderboard does not take {flags[0]} — see `posenc leaderboard --help`")
    parsed = parse_overrides(args)
    changing = [o.override.input_line for o in parsed
                if not (o.key == "encoding" or o.key.startswith(("encoding.", "encoding@")))]
    if changing:
        raise UserError(f"{changing[0]} would change the benchmark protocol, so the shipped rows would not compare — "
                        f"posenc leaderboard takes only encoding=NAME and its encoding.KEY=… options "
                        f"(to study other settings, use `posenc train -m` and `posenc compare`)")
    if not any(o.key == "encoding" for o in parsed):
        raise UserError("name the encoding: `posenc leaderboard encoding=NAME` (its options as encoding.KEY=…)")
    sweeps = [o.override.input_line for o in parsed if o.override.is_sweep_override()]
    if sweeps:
        raise UserError(f"{sweeps[0]}: posenc leaderboard runs one encoding — run it once per value")
    return args


def label_of(args: list[str]) -> str:
    """The row's name: the encoding, with its options when any are given (`rope base=500`)."""
    parsed = parse_overrides(args)
    name = next(str(v) for k, v, _ in parsed if k == "encoding")
    options = [f"{k.split('.', 1)[1] if k.startswith('encoding.') else k}={v}" for k, v, _ in parsed if k != "encoding"]
    return " ".join([name, *options])
