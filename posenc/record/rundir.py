"""A run directory's layout, owned by one class: ``RunDir`` is the only code that knows which file
of a run holds what, and every command reads a run through it (tests/test_rundir.py holds the rule).

A run directory (Hydra's output dir) holds:

- ``.hydra/``: Hydra's ``config.yaml`` (the composed config), ``overrides.yaml`` (what the command
  line changed) and ``hydra.yaml`` (Hydra's own config: the group choices);
- ``train.log``, ``metrics.jsonl`` (one JSON object per log step), ``summary.json`` (written once,
  at the end, atomically), ``provenance.json`` (where the encoding's code came from:
  provenance.py), ``parent.json`` (the run ``trainer.init_from`` started from);
- ``checkpoints/``: ``last.safetensors`` and/or ``best.safetensors``, as ``trainer.checkpoint`` says
  (tensors and JSON, never a pickle: statefile.py); a run made before checkpoint format 2 holds
  pickles (``last.pt``, ``best.pt``), which only ``posenc convert`` reads (convert.py);
- what later commands add: ``eval.json`` (``eval_<settings>.json`` under other settings),
  ``per_position.json``/``.png`` (``per_position_<eval file>.*`` beside an evaluation), ``probes/``
  (``probes.json`` and PNGs), and W&B's own ``wandb/`` (``wandb.init(dir=<run dir>)`` makes it).

A sweep directory (Hydra's multirun) holds ``multirun.yaml``, ``sweep.json`` and a run dir per job (sweepdir.py).

A RunDir reads each file once: the config, the overrides and Hydra's choices are parsed on first
use and kept, and the checkpoint a finished run is evaluated from is resolved once. One RunDir
serves one command; the writer side (training, checkpoints, the summary) takes its paths from it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from posenc.config.load import typed_run_config
from posenc.errors import UserError
from posenc.record.directory import read_jsonl, varied_values

# --- the names of a run directory's files, defined here alone ------------------------------
HYDRA_DIR = ".hydra"
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
HYDRA_FILE = "hydra.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PROVENANCE_FILE = "provenance.json"
PARENT_FILE = "parent.json"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_SUFFIX = ".safetensors"
LEGACY_SUFFIX = ".pt"  # checkpoint format 1, a pickle
EVAL_STEM = "eval"
PER_POSITION_STEM = "per_position"
PROBES_DIR = "probes"
PROBES_FILE = "probes.json"
MULTIRUN_FILE = "multirun.yaml"  # a sweep directory's, written by Hydra
SWEEP_FILE = "sweep.json"  # a sweep directory's, written by posenc (sweepdir.py)
#: as help and messages name them, relative to the run directory
LAST_CHECKPOINT = f"{CHECKPOINTS_DIR}/last{CHECKPOINT_SUFFIX}"
BEST_CHECKPOINT = f"{CHECKPOINTS_DIR}/best{CHECKPOINT_SUFFIX}"
LEGACY_CHECKPOINTS = f"{CHECKPOINTS_DIR}/*{LEGACY_SUFFIX}"


def eval_file_name(setting: str = "") -> str:
    """eval.json, or eval_<setting>.json: an evaluation under other settings sits beside it."""
    return f"{EVAL_STEM}_{setting}.json" if setting else f"{EVAL_STEM}.json"


class RunDir:
    """One run directory: where each of its files is, and what the commands ask of it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.hydra_dir = self.path / HYDRA_DIR
        self.config_file = self.hydra_dir / CONFIG_FILE  # the composed config
        self.overrides_file = self.hydra_dir / OVERRIDES_FILE  # what the command line changed
        self.hydra_file = self.hydra_dir / HYDRA_FILE  # Hydra's own config: the group choices
        self.metrics_file = self.path / METRICS_FILE
        self.summary_file = self.path / SUMMARY_FILE
        self.provenance_file = self.path / PROVENANCE_FILE
        self.parent_file = self.path / PARENT_FILE
        self.checkpoints_dir = self.path / CHECKPOINTS_DIR
        self.probes_dir = self.path / PROBES_DIR
        self._read: dict[str, Any] = {}  # what each file held when first asked for (None: no such file)
        self._to_load: Path | None = None

    @classmethod
    def of(cls, run: RunDir | Path | str) -> RunDir:
        """run itself when it is a RunDir (what it read stays read), else a RunDir at that path."""
        return run if isinstance(run, RunDir) else cls(run)

    @staticmethod
    def under(path: Path) -> list[RunDir]:
        """Every run directory at or under path, in path order."""
        return [RunDir(p) for p in sorted(h.parent for h in Path(path).rglob(HYDRA_DIR) if h.is_dir())]

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # --- where each file is ------------------------------------------------------------------
    def checkpoint(self, kind: str = "last") -> Path:
        """checkpoints/last.safetensors (what resume continues from) or checkpoints/best.safetensors."""
        return self.checkpoints_dir / f"{kind}{CHECKPOINT_SUFFIX}"

    def kept_checkpoint(self) -> bool:
        return self.checkpoint().is_file() or self.checkpoint("best").is_file()

    @staticmethod
    def per_position_stem(evaluation: Path | None = None) -> str:
        """per_position (training's), or per_position_<eval file's stem> beside an evaluation."""
        return f"{PER_POSITION_STEM}_{evaluation.stem}" if evaluation is not None else PER_POSITION_STEM

    # --- what it holds, each file read once --------------------------------------------------
    def is_run(self) -> bool:
        return self.hydra_dir.is_dir()

    def _once(self, path: Path, parse: Callable[[str], Any]) -> Any:
        """path's text parsed, read on the first call only (None where there is no such file)."""
        key = str(path)
        if key not in self._read:
            self._read[key] = parse(path.read_text(encoding="utf-8")) if path.is_file() else None
        return self._read[key]

    def saved_config(self) -> DictConfig:
        """.hydra/config.yaml as the run saved it (untyped: load_run_config types it), read once, shared: read-only."""
        saved = self._once(self.config_file, OmegaConf.create)
        if saved is None:
            raise UserError(f"{self.path} has no {HYDRA_DIR}/{CONFIG_FILE} — pass a run directory made by "
                            f"`posenc train`")
        OmegaConf.set_readonly(saved, True)
        return saved

    def overrides(self) -> list[str]:
        """The task overrides the run was made with (.hydra/overrides.yaml; [] without one)."""
        return [str(item) for item in self._once(self.overrides_file, yaml.safe_load) or []]

    def choices(self) -> dict:
        """The config group choices Hydra recorded (.hydra/hydra.yaml: {"encoding": "rope", ...}; {} without one)."""
        return dict(((self._once(self.hydra_file, yaml.safe_load) or {}).get("hydra") or {}).get("runtime", {}).get("choices") or {})

    def varied(self) -> list[str]:
        """What tells the run apart from those it was run with: ['base=500', 'seed=1'] (directory.varied_values)."""
        hydra = (self._once(self.hydra_file, yaml.safe_load) or {}).get("hydra") or {}
        return varied_values(hydra, self.overrides(), (self.path.parent / MULTIRUN_FILE).is_file())

    def provenance(self) -> dict | None:
        """provenance.json: where the encoding's code came from (None: a run made before it was recorded)."""
        return self._once(self.provenance_file, json.loads)

    def summary(self) -> dict | None:
        """summary.json as it is now (None: still running, or killed)."""
        return json.loads(self.summary_file.read_text()) if self.summary_file.is_file() else None

    def evaluations(self) -> dict[str, dict]:
        """{file name: record} of every evaluation `posenc eval` wrote (eval.json, eval_<settings>.json)."""
        return {p.name: json.loads(p.read_text()) for p in sorted(self.path.glob(f"{EVAL_STEM}*.json"))
                if p.name == eval_file_name() or p.name.startswith(f"{EVAL_STEM}_")}

    def metrics(self) -> list[dict]:
        """metrics.jsonl's rows, one per log step, as the file holds them now."""
        return read_jsonl(self.metrics_file) if self.metrics_file.is_file() else []

    def has_results(self) -> bool:
        """A metrics row or a last checkpoint: something worth keeping."""
        metrics = self.metrics_file
        return (metrics.exists() and metrics.stat().st_size > 0) or self.checkpoint().exists()

    def last_written(self) -> float:
        """When the run last wrote anything (its summary, else its metrics, else its config)."""
        for path in (self.summary_file, self.metrics_file, self.config_file):
            if path.exists():
                return path.stat().st_mtime
        return 0.0

    def discard_results(self) -> None:
        """A job that stopped before its first checkpoint starts over: metrics, summary and checkpoints go."""
        for leftover in (self.metrics_file, self.summary_file):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(self.checkpoints_dir, ignore_errors=True)

    # --- its checkpoints ---------------------------------------------------------------------
    def checkpoint_kind(self) -> str:
        """The run's trainer.checkpoint (last for runs made before it existed)."""
        kind = OmegaConf.select(self.saved_config(), "trainer.checkpoint", default=None) \
            if self.config_file.is_file() else None
        return kind or "last"

    def legacy_checkpoints(self) -> list[Path]:
        """The pickled checkpoints (last.pt, best.pt) of a run before checkpoint format 2, with no converted file beside."""
        return [p for kind in ("last", "best") if (p := self.checkpoints_dir / f"{kind}{LEGACY_SUFFIX}").is_file()
                and not self.checkpoint(kind).is_file()]

    def refuse_legacy(self) -> None:
        """Pickled checkpoints refused (unpickling runs any code they name), with the command that converts them."""
        old = self.legacy_checkpoints()
        if old:
            names = ", ".join(str(p.relative_to(self.path)) for p in old)
            raise UserError(f"'{self.path}' holds checkpoints in the old pickle format ({names}); loading a pickle can "
                            f"run any code in it, so posenc no longer does — convert the run once with "
                            f"`posenc convert {self.path}` (it reads only tensors and RNG state)")

    def require_checkpoint(self, key: str, no_dir: str, advice: str | None = None) -> Path:
        """The run, absolute, checked to exist and to hold checkpoints/last.safetensors (what
        trainer.resume and trainer.init_from continue from), else one line naming key: pickles with
        the command that converts them; else advice, or why the run has none and to start anew."""
        if not self.path.is_dir():
            raise UserError(f"{key}: run dir '{self.path}' does not exist — {no_dir}")
        if not self.checkpoint().is_file():
            self.refuse_legacy()
            advice = advice or f"{self._no_last()}; start a new run"
            raise UserError(f"{key}: '{self.path}' has no {LAST_CHECKPOINT} — {advice}")
        return self.path.resolve()

    def _no_last(self) -> str:
        """Why a run holds no last checkpoint, from its trainer.checkpoint."""
        return {"none": "it ran with trainer.checkpoint=none and kept no checkpoint",
                "best": f"it ran with trainer.checkpoint=best and completed, keeping {BEST_CHECKPOINT} alone "
                        f"(trainer.checkpoint=last keeps what a resume needs)"}.get(self.checkpoint_kind(),
                                                                                     "it saved no checkpoint")

    def checkpoint_to_load(self) -> Path:
        """The checkpoint a finished run is evaluated from, resolved once: the best where the run
        kept it, else the last; one line where the run kept none, holds pickles, or saved none yet."""
        if self._to_load is None:
            if self.checkpoint_kind() == "none":
                raise UserError(f"run '{self.path}' kept no checkpoint (it ran with trainer.checkpoint=none) — "
                                f"train it again with trainer.checkpoint=last or best to evaluate it")
            self.refuse_legacy()
            best = self.checkpoint("best")
            self._to_load = best if best.is_file() else self.checkpoint()
        return self._to_load

    def load_checkpoint(self, kind: str | None = None, tensors: bool = True) -> dict:
        """The checkpoint of that kind (None: checkpoint_to_load), read by statefile.read_checkpoint;
        tensors=False reads its header alone."""
        # imported here (start-up): numpy and safetensors load when a checkpoint is read, not for `posenc --help`
        from posenc.record.statefile import read_checkpoint

        path = self.checkpoint_to_load() if kind is None else self.checkpoint(kind)
        if not path.is_file():
            self.refuse_legacy()
        return read_checkpoint(path, tensors)


def load_checkpoint(path: Path | str, tensors: bool = True) -> dict:
    """A checkpoint file, or a run directory's checkpoint_to_load (a pickle beside a missing
    file refused with `posenc convert`)."""
    # imported here (start-up), as in RunDir.load_checkpoint
    from posenc.record.statefile import read_checkpoint

    path = Path(path)
    if path.is_dir():
        return RunDir(path).load_checkpoint(tensors=tensors)
    if not path.is_file() and path.parent.name == CHECKPOINTS_DIR:
        RunDir(path.parent.parent).refuse_legacy()
    return read_checkpoint(path, tensors)


def load_run_config(run: RunDir | Path, overrides: list[str]) -> DictConfig:
    """A run's config: .hydra/config.yaml read once by its RunDir, typed by the schema, with
    Hydra-syntax overrides of existing keys (``+key=value`` adds one)."""
    return typed_run_config(RunDir.of(run).saved_config(), overrides)
