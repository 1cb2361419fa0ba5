"""A run directory and a sweep directory: their layout, atomic writes, reading them back.

A run directory (Hydra's output dir) holds ``.hydra/`` (the composed config and the
overrides), ``train.log``, ``metrics.jsonl`` (one JSON object per log step), ``summary.json``
(written once, at the end, atomically), ``checkpoints/`` (``last.safetensors`` and/or
``best.safetensors``, as ``trainer.checkpoint`` says: tensors and JSON, never a pickle,
posenc/run/statefile.py) and ``wandb/``. A sweep lands in
``outputs/sweeps/<date>/<time with µs>_<name>/<job.num>_<swept values>`` (conf/config.yaml):
``<name>`` is the experiment's (or ``name=``), else the swept keys and values
(``encoding-rope,alibi_seed-0,1``: sweep_name), and each job's directory carries its own
values of the swept keys (``0_encoding=rope_seed=0``: job_dir_name). Hydra writes the composed
sweep config to ``multirun.yaml``, and the first job to start writes ``sweep.json``: the name,
when it started, the overrides, the sweeper and the launcher.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from posenc.errors import UserError
from posenc.run.statefile import load_state

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
SWEEP_FILE = "sweep.json"
CHECKPOINT_VERSION = 2  # 1: a torch.save pickle (checkpoints/*.pt), read only by `posenc convert`
CHECKPOINT_SUFFIX = ".safetensors"
LEGACY_SUFFIX = ".pt"
REQUIRED_KEYS = ("version", "model", "optimizer", "scheduler", "sampler", "rng", "step", "tokens", "config")


#: trainer.checkpoint: what a run keeps (posenc/train/checkpoint.py Checkpoints)
CHECKPOINT_KINDS = ("last", "best", "none")


def checkpoint_path(run_dir: Path, kind: str = "last") -> Path:
    """checkpoints/last.safetensors (what resume continues from) or checkpoints/best.safetensors."""
    return Path(run_dir) / "checkpoints" / f"{kind}{CHECKPOINT_SUFFIX}"


def legacy_checkpoints(run_dir: Path) -> list[Path]:
    """The pickled checkpoints (checkpoints/last.pt, best.pt) of a run dir made before
    checkpoint format 2, where no converted file sits beside them."""
    return [p for kind in ("last", "best")
            if (p := Path(run_dir) / "checkpoints" / f"{kind}{LEGACY_SUFFIX}").is_file()
            and not checkpoint_path(run_dir, kind).is_file()]


def refuse_legacy(run_dir: Path) -> None:
    """A run dir whose checkpoints are pickles is refused (unpickling runs whatever code the file
    names), with the command that converts it (reading tensors and RNG state only)."""
    old = legacy_checkpoints(run_dir)
    if old:
        names = ", ".join(str(p.relative_to(run_dir)) for p in old)
        raise UserError(f"'{run_dir}' holds checkpoints in the old pickle format ({names}); loading a pickle can run "
                        f"any code in it, so posenc no longer does — convert the run once with "
                        f"`posenc convert {run_dir}` (it reads only tensors and RNG state)")


def run_checkpoint_kind(run_dir: Path) -> str:
    """The run's trainer.checkpoint (last for runs made before it existed)."""
    saved = Path(run_dir) / ".hydra" / "config.yaml"
    kind = OmegaConf.select(OmegaConf.load(saved), "trainer.checkpoint", default=None) if saved.is_file() else None
    return kind or "last"


def kept_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a finished run is evaluated from: the best where the run kept it, else
    the last."""
    best = checkpoint_path(run_dir, "best")
    return best if best.is_file() else checkpoint_path(run_dir)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temp file and rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def load_checkpoint(path: Path | str, tensors: bool = True) -> dict:
    """Read a checkpoint (a file, or a run dir: its kept_checkpoint); a missing, corrupt, pickled
    or foreign file is a UserError saying so. Nothing in the file can run code (statefile.py).
    tensors=False reads its header alone (step, config, ...; every tensor None)."""
    path = Path(path)
    if path.is_dir():
        if run_checkpoint_kind(path) == "none":
            raise UserError(f"run '{path}' kept no checkpoint (it ran with trainer.checkpoint=none) — "
                            f"train it again with trainer.checkpoint=last or best to evaluate it")
        refuse_legacy(path)
        path = kept_checkpoint(path)
    if not path.is_file() and path.parent.name == "checkpoints":
        refuse_legacy(path.parent.parent)
    if not path.is_file():
        raise UserError(f"no checkpoint at '{path}' — the run saved none yet (see trainer.checkpoint_interval); "
                        f"start a new run instead")
    try:
        state = load_state(path, tensors=tensors)
    except Exception as e:  # noqa: BLE001 - a pickle, truncated bytes, another safetensors file...
        raise UserError(f"checkpoint '{path}' is not a posenc checkpoint, or is corrupt ({type(e).__name__}); "
                        f"posenc reads only its own safetensors checkpoints — point at a run dir made by "
                        f"`posenc train`, or resume from an earlier copy") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise UserError(f"'{path}' is not a posenc checkpoint — point at a run dir made by `posenc train`")
    if state["version"] != CHECKPOINT_VERSION:
        raise UserError(f"checkpoint '{path}' has format v{state['version']}, this posenc reads "
                        f"v{CHECKPOINT_VERSION} — use the posenc version that wrote it, or start a new run")
    return state


def refuse_sweep_dir(path: Path, command: str) -> None:
    """A sweep dir given where one run is wanted (``posenc eval``, ``posenc probe``) is refused with
    its runs and the command for one of them."""
    from posenc.output.commands import shell_word

    path = Path(path)
    if (path / ".hydra").is_dir() or not ((path / "multirun.yaml").is_file() or (path / SWEEP_FILE).is_file()):
        return
    runs = sorted((p for p in path.iterdir() if (p / ".hydra").is_dir()), key=lambda p: (len(p.name), p.name))
    if not runs:
        raise UserError(f"'{path}' is a sweep dir whose jobs never started — it has no run to {command}")
    listed = ", ".join(p.name for p in runs[:8]) + (f", … ({len(runs)} in all)" if len(runs) > 8 else "")
    raise UserError(f"'{path}' is a sweep dir, not one run; its runs: {listed} — {command} one with "
                    f"`posenc {command} {shell_word(str(runs[0]))}`, or compare them all with "
                    f"`posenc compare {shell_word(str(path))}`")


def refuse_non_run_dir(path: Path, command: str) -> None:
    """A folder that is not a run directory (no ``.hydra/``: a parent of runs, a copy of a checkpoint
    folder, any other folder) given where one run is wanted is refused as such, with a run under it
    where there is one, instead of a missing checkpoint's message."""
    from posenc.output.commands import shell_word

    path = Path(path)
    if (path / ".hydra").is_dir():
        return
    runs = sorted((p.parent for p in path.rglob(".hydra") if p.is_dir()), key=lambda p: (str(p.parent), len(p.name), p.name))
    if runs:
        more = f" (and {len(runs) - 1} more under it)" if len(runs) > 1 else ""
        raise UserError(f"'{path}' is not a run directory (no .hydra/ in it); it holds {shell_word(str(runs[0]))}{more} — "
                        f"{command} one run with `posenc {command} {shell_word(str(runs[0]))}`")
    raise UserError(f"'{path}' is not a run directory (no .hydra/ in it, and no run under it) — pass a directory "
                    f"`posenc train` made, e.g. outputs/<date>/<time>_<encoding>")


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


def has_results(run_dir: Path) -> bool:
    metrics = run_dir / METRICS_FILE
    return (metrics.exists() and metrics.stat().st_size > 0) or checkpoint_path(run_dir).exists()


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


def record_sweep(sweep_dir: Path) -> None:
    """Write sweep.json once per sweep (exclusive create: the first job wins, others skip)."""
    hc = HydraConfig.get()
    # multirun.yaml (Hydra's, written before any job) holds the sweep's own overrides;
    # a job's HydraConfig only knows the job's
    multirun = sweep_dir / "multirun.yaml"
    overrides = list(OmegaConf.load(multirun).hydra.overrides.task) if multirun.exists() else []
    meta = {
        "name": sweep_dir.name.partition("_")[2] or "sweep",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["posenc", "train", "-m", *overrides]),
        "overrides": overrides,
        "sweeper": OmegaConf.to_container(hc.sweeper, resolve=True),
        "launcher": OmegaConf.to_container(hc.launcher, resolve=True),
        "group": sweep_group(sweep_dir),
    }
    try:  # 0o644: a data file, not a program (os.open's default mode is 0o777)
        fd = os.open(sweep_dir / SWEEP_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, indent=2, default=str)
        f.write("\n")


def read_sweep(sweep_dir: Path) -> dict | None:
    path = sweep_dir / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else None


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
    from posenc.config import parse_overrides

    swept = [(o.key, plain_number(o.value) if isinstance(o.value, (int, float)) else o.override.get_value_element_as_str())
             for o in parse_overrides(task_overrides) if o.key not in set(exclude) and not o.key.startswith("hydra")]
    short = short_keys([k for k, _ in swept])
    name = "_".join(f"{short[k]}={v}" for k, v in swept)
    return _safe(name)[:NAME_LIMIT].rstrip("_-,.") or _safe(str(fallback))


# ${posenc.job_dir:${hydra.overrides.task},${hydra.job.config.override_dirname.exclude_keys},${encoding.name}}
# in conf/config.yaml's hydra.sweep.subdir: resolved once per job, in whichever process runs it
OmegaConf.register_new_resolver(
    "posenc.job_dir",
    lambda overrides, exclude, fallback: job_dir_name(list(overrides or []), list(exclude or []), fallback),
    replace=True,
)
