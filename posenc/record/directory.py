"""Run and sweep directories by name, and writing their files: atomic JSON, JSON lines.

What a run directory holds, and every file name in it, is posenc/record/rundir.py's (``RunDir``); a
sweep directory's is posenc/record/sweepdir.py's. Here: how directories are named and removed. A sweep
lands in ``outputs/sweeps/<date>/<time with µs>_<name>/<job.num>_<swept values>`` (conf/config.yaml):
``<name>`` is the experiment's (or ``name=``), else the swept keys and values
(``encoding-rope,alibi_seed-0,1``: sweep_name), and each job's directory carries its own
values of the swept keys (``0_encoding=rope_seed=0``: job_dir_name); its W&B group is
``<name>-<date>-<time>`` (sweep_group).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from posenc.config import parse_overrides


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temporary file of its own in the same directory and a rename, so a reader
    never sees half a file and two writers of one path (two sweep jobs caching one verdict) never
    write into each other's: the temporary name is unique (``.<name>.<random>.tmp``, created
    exclusively, with the permissions any new file gets), and removed if the write fails."""
    text = json.dumps(obj, indent=2, default=str) + "\n"
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def nearest_path(path: Path) -> Path | None:
    """The existing path a mistyped one most likely meant: each part that does not exist replaced by
    the closest name in its folder (difflib), or, for a part written with the README's placeholders
    (``<date>``, ``<time>_base-…``), by the newest name that fits it; None where some part has no
    such name (or the path exists)."""
    import difflib

    path = Path(path)
    if path.exists():
        return None
    current = Path(path.anchor) if path.is_absolute() else Path(".")
    for part in path.parts[1:] if path.is_absolute() else path.parts:
        if (current / part).exists():
            current = current / part
            continue
        try:
            names = [p.name for p in current.iterdir()]
        except OSError:
            return None
        if "<" in part and ">" in part:  # outputs/sweeps/<date>/<time>_name, pasted as the docs write it
            pattern = re.compile(".*".join(re.escape(piece) for piece in re.split(r"<[^>]*>", part)))
            fits = [n for n in names if pattern.fullmatch(n)]
            match = max(fits, key=lambda n: (current / n).stat().st_mtime, default=None)
        else:
            match = next(iter(difflib.get_close_matches(part, names, n=1, cutoff=0.6)), None)
        if match is None:
            return None
        current = current / match
    return current


def missing_path(path: Path, what: str) -> str:
    """'outputs/x does not exist — did you mean outputs/y? (give …)': a path that is not there, the
    nearest one that is, and what the command takes (what)."""
    near = nearest_path(path)
    return f"{path} does not exist — " + (f"did you mean {near}? ({what})" if near is not None else what)


def remove_run_dir(run_dir: Path) -> None:
    """Delete a run dir and any parents it leaves empty, outputs/ included: a refused run
    leaves nothing behind."""
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = run_dir.parent
    while parent.name:
        try:
            parent.rmdir()  # only succeeds when empty
        except OSError:
            break
        if parent.name == "outputs":
            break
        parent = parent.parent


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_group(sweep_dir: Path) -> str:
    """A sweep's W&B group: `<name>-<date>-<time>` from its directory, unique per sweep."""
    time_name = sweep_dir.name
    stamp, _, name = time_name.partition("_")
    return f"{name or 'sweep'}-{sweep_dir.parent.name}-{stamp}"


def wandb_group(configured: str | None) -> str | None:
    """logger.group if set; else, in a sweep, the sweep's group, so every job shares it."""
    if configured:
        return configured
    return sweep_group(Path(HydraConfig.get().sweep.dir)) if in_multirun() else None


# --- names of sweep and job directories ---------------------------------------------------
NAME_LIMIT = 80  # characters of a sweep's or job's name: readable in `ls`, far below any filesystem's limit


def plain_number(value: Any) -> str:
    """A value as the user typed it: 10000.0 -> '10000' (never '1e+04'), 0.5 -> '0.5', 'rope' -> 'rope'."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def plain_numbers(options: dict) -> dict:
    """options with whole floats as ints, so summaries and tables print base=10000, not 10000.0."""
    return {k: int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 1e16 else v for k, v in options.items()}


def _safe(text: str) -> str:
    """text with anything but letters, digits and . , + - = _ replaced by '-' (no '/', no spaces)."""
    return re.sub(r"[^A-Za-z0-9.,+=_-]+", "-", text).strip("-")


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key by its last dotted part (encoding.base -> base) where that is unambiguous."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def sweep_name(swept: dict[str, list]) -> str:
    """A sweep's name from its swept keys and their values: {'encoding': ['rope', 'alibi'],
    'seed': [0, 1]} -> 'encoding-rope,alibi_seed-0,1'; a long list shows its ends
    ('base-10..1000000'). 'sweep' when nothing is swept."""
    parts = []
    for key, short in short_keys(list(swept)).items():
        values = [plain_number(v) for v in swept[key]]
        shown = ",".join(values)
        if len(shown) > 24 and len(values) > 2:
            shown = f"{values[0]}..{values[-1]}"
        parts.append(f"{short}-{shown}")
    return _safe("_".join(parts))[:NAME_LIMIT].rstrip("_-,.") or "sweep"


def job_dir_name(task_overrides: list[str], exclude: list[str], fallback: str) -> str:
    """A job's directory name (after '<job.num>_'): its values of the swept keys, the overrides
    not in exclude (the sweep's fixed ones), e.g. 'encoding=rope_seed=0'; fallback when none."""
    name = "_".join(swept_values(task_overrides, exclude))
    return _safe(name)[:NAME_LIMIT].rstrip("_-,.") or _safe(str(fallback))


def varied_values(hydra: dict, task_overrides: list[str], in_sweep: bool) -> list[str]:
    """What tells a run apart from the others it was run with, as the user typed it, from its Hydra
    config (.hydra/hydra.yaml's ``hydra`` node): a sweep job's own values of the swept keys
    (['base=500', 'seed=1']: its overrides but the sweep's fixed ones, override_dirname.exclude_keys,
    as in its directory's name); a single run's encoding options (['base=500'])."""
    overrides = [str(o) for o in (hydra.get("overrides") or {}).get("task") or task_overrides]
    if str(hydra.get("mode")).endswith("MULTIRUN") or in_sweep:
        exclude = OmegaConf.select(OmegaConf.create(hydra), "job.config.override_dirname.exclude_keys", default=None)
        return swept_values(overrides, [*(exclude or []), "name", "trainer.resume"])
    keys = [o.key for o in parse_overrides(overrides) if not o.key.startswith("hydra")]
    return [v for v, key in zip(swept_values(overrides, []), keys) if key.startswith("encoding.")]


def swept_values(task_overrides: list[str], exclude: list[str]) -> list[str]:
    """A job's own values of what its sweep varies, its overrides not in exclude (the sweep's fixed
    keys) as the user typed them, each key by its last part where unambiguous: ['base=500', 'seed=1']."""
    swept = [(o.key, plain_number(o.value) if isinstance(o.value, (int, float)) else o.override.get_value_element_as_str())
             for o in parse_overrides(task_overrides) if o.key not in set(exclude) and not o.key.startswith("hydra")]
    short = short_keys([k for k, _ in swept])
    return [f"{short[k]}={v}" for k, v in swept]


# ${posenc.job_dir:${hydra.overrides.task},${hydra.job.config.override_dirname.exclude_keys},${encoding.name}}
# in conf/config.yaml's hydra.sweep.subdir: resolved once per job, in whichever process runs it
OmegaConf.register_new_resolver(
    "posenc.job_dir",
    lambda overrides, exclude, fallback: job_dir_name(list(overrides or []), list(exclude or []), fallback),
    replace=True,
)
