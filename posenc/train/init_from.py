"""``trainer.init_from=<run dir>``: start a new run from a finished run's weights.

The context-extension recipe of Position Interpolation (Chen et al., 2023) and YaRN (Peng et
al., 2023): train at T, change the RoPE frequencies to reach s·T, fine-tune briefly at s·T.
The new run (the child) takes the parent's **weights only**: its optimiser, learning-rate
schedule (warmup included), step, token count, data sampler and RNG start fresh from the
child's own config and seed. Any ``trainer.*`` and the encoding's scaling settings may differ;
whatever would make the weights mean something else may not:

- ``model.*`` (but ``dropout``), every ``tokenizer.*``, and ``dataset.*`` when the tokenizer
  is trained on the corpus (BPE: another corpus is another vocabulary);
- ``encoding._target_``, and any other encoding option that changes the encoding's parameter
  shapes (T5's ``num_buckets``, learned ``max_len``, ...).

A mismatch is refused with one ``error:`` line naming the keys, before Hydra creates the run
dir (cli/hydra_commands.check_run) and again in each job (a sweep over a model key). When the
scaling's training length ``encoding.original_max_len`` is not given on the command line, the
child takes the parent's ``trainer.seq_len``: the T the parent was trained at, not the child's
new, longer seq_len (parent_overrides), whether the command line names the parent's encoding
(``encoding=rope``) or leaves it to the default. The child's dir holds ``parent.json`` (the parent's
path, step and config) and its summary a ``parent`` entry, with whether the parent's checkpoint
rebuilt the model that trained (``checkpoint_proof``: posenc/eval/proof.py; one warning where not).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from posenc.build import build_encoding, restore_weights
from posenc.config import parse_overrides
from posenc.errors import UserError
from posenc.eval import proof
from posenc.record import provenance
from posenc.record.directory import write_json_atomic
from posenc.record.rundir import LAST_CHECKPOINT, RunDir, load_run_config

log = logging.getLogger("posenc")

KEY = "trainer.init_from"
UNSET = (None, False, "", "none", "null", "false")
#: model keys that do not change what the weights are
FREE_MODEL_KEYS = ("dropout",)
#: encoding keys that change how positions are scaled, never a parameter's shape
SCALING_KEYS = ("scaling", "scaling_factor", "original_max_len", "low_freq_factor", "high_freq_factor",
                "short_factor", "long_factor", "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim")
#: tokenizers whose vocabulary is learned from the corpus: the dataset is part of the vocabulary
TRAINED_TOKENIZERS = ("posenc.data.tokenizers.BPETokenizer",)
#: an encoding's parameter shapes by state_dict name
Shapes = dict[str, tuple[int, ...]]


def requested(value: Any) -> bool:
    return not (value in UNSET or (isinstance(value, str) and value.strip().lower() in UNSET))


def parent_dir(value: Any) -> Path:
    """The parent run dir trainer.init_from names, absolute, checked to hold a checkpoint."""
    return RunDir(Path(str(value)).expanduser()).require_checkpoint(
        KEY, f"pass the directory of a finished `posenc train` run (it holds {LAST_CHECKPOINT})",
        "start from a run that saved one")


def parent_config(run_dir: Path) -> DictConfig:
    """The parent's composed config (.hydra/config.yaml), typed as posenc reads a run, read once
    per process: the CLI's overrides, its pre-check and the job's check all ask for it. Cached by
    the resolved path and the file's time and size (a parent re-run in place is read again);
    read-only, since every caller shares it."""
    return _read_parent(*_parent_key(run_dir))


def parent_shapes(run_dir: Path) -> Shapes:
    """The parameter shapes of the parent's encoding, built once per process (as parent_config)."""
    return _parent_shapes(*_parent_key(run_dir))


def _parent_key(run_dir: Path) -> tuple[str, tuple[int, int]]:
    run_dir = Path(run_dir).resolve()
    try:
        stat = RunDir(run_dir).config_file.stat()
    except OSError:  # no config: load_run_config says what to do, and nothing is cached
        return str(run_dir), (0, 0)
    return str(run_dir), (stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_parent(run_dir: str, stamp: tuple[int, int]) -> DictConfig:
    cfg = load_run_config(Path(run_dir), [])
    OmegaConf.set_readonly(cfg, True)
    return cfg


@functools.lru_cache(maxsize=16)
def _parent_shapes(run_dir: str, stamp: tuple[int, int]) -> Shapes:
    return _encoding_shapes(_read_parent(run_dir, stamp))


def _flat(node: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(node, DictConfig):
        return {prefix: node}
    container = OmegaConf.to_container(node, resolve=True)
    return {f"{prefix}.{k}": v for k, v in container.items()}  # type: ignore[union-attr]


def _differing(parent: dict[str, Any], child: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    keys = sorted(set(parent) | set(child))
    return [f"{k} (parent {parent.get(k)!r}, this run {child.get(k)!r})" for k in keys
            if k.rpartition(".")[2] not in skip and parent.get(k) != child.get(k)]


def _encoding_shapes(cfg: DictConfig) -> Shapes:
    """The parameter shapes of cfg's encoding: the encoding module alone is built, not a model."""

    return shapes_of(build_encoding(cfg))


def shapes_of(encoding: torch.nn.Module) -> Shapes:
    return {name: tuple(t.shape) for name, t in encoding.state_dict().items()}


def incompatible(parent: DictConfig, child: DictConfig, parent_shapes: Callable[[], Shapes] | None = None,
                 child_shapes: Callable[[], Shapes] | None = None) -> list[str]:
    """The keys on which child's weights would not be parent's: 'key (parent X, this run Y)'.
    Their encodings' parameter shapes are compared only when every other key agrees: built from
    each config, unless parent_shapes / child_shapes give them (a parent's shapes held, the
    child's encoding already built)."""
    out = _differing(_flat(parent.model, "model"), _flat(child.model, "model"), FREE_MODEL_KEYS)
    out += _differing(_flat(parent.tokenizer, "tokenizer"), _flat(child.tokenizer, "tokenizer"))
    if child.tokenizer.get("_target_") in TRAINED_TOKENIZERS:
        out += _differing(_flat(parent.dataset, "dataset"), _flat(child.dataset, "dataset"))
    p_enc, c_enc = _flat(parent.encoding, "encoding"), _flat(child.encoding, "encoding")
    target = "encoding._target_"
    if p_enc.get(target) != c_enc.get(target):  # another encoding: its options cannot be compared
        return [*out, *_differing({target: p_enc.get(target)}, {target: c_enc.get(target)})]
    if not out and ((parent_shapes or functools.partial(_encoding_shapes, parent))()
                    != (child_shapes or functools.partial(_encoding_shapes, child))()):
        # an option that sizes a parameter table differs: name the non-scaling options that do,
        # or the training length that a null size follows (learned's max_len, CoPE's npos_max)
        out += _differing(p_enc, c_enc, SCALING_KEYS) or _length_sized(parent, child, c_enc) \
            or ["encoding (its parameter shapes)"]
    return out


def _length_sized(parent: DictConfig, child: DictConfig, c_enc: dict[str, Any]) -> list[str]:
    """'trainer.seq_len (parent 32, this run 128) sizes encoding.max_len (null) — …' where a
    null size key of the encoding follows the two runs' different training lengths."""
    P, C = int(parent.trainer.seq_len), int(child.trainer.seq_len)
    nulls = [k for k, v in c_enc.items() if v is None and k.rpartition(".")[2] not in SCALING_KEYS]
    if P == C or not nulls:
        return []
    return [f"trainer.seq_len (parent {P}, this run {C}), which sizes {' and '.join(f'{k} (null: the training length)' for k in nulls)}"
            f" — set {' '.join(f'{k}={P}' for k in nulls)}"]


def follows_training_length(enc: DictConfig, key: str) -> bool:
    """The key is null (the builder's training length), or an older run's ${trainer.seq_len}."""
    return key in enc and (enc.get(key) is None or OmegaConf.is_interpolation(enc, key))


def check(cfg: DictConfig, encoding: torch.nn.Module | None = None) -> Path | None:
    """The parent run dir if cfg sets trainer.init_from and the two fit; else None. A misfit is
    one UserError naming every differing key. encoding: cfg's, when already built (training's):
    its shapes are compared, not a second build's."""
    value = OmegaConf.select(cfg, KEY, default=None)
    if not requested(value):
        return None
    run_dir = parent_dir(value)
    parent = parent_config(run_dir)
    differing = incompatible(parent, cfg, functools.partial(parent_shapes, run_dir),
                             None if encoding is None else functools.partial(shapes_of, encoding))
    if differing:
        raise UserError(f"{KEY}={value}: this run's weights would not be the parent's — it differs on "
                        f"{'; '.join(differing)}; use the parent's values for these keys "
                        f"(only trainer.*, model.dropout and the encoding's scaling settings may change)")
    T = int(parent.trainer.seq_len)
    enc = cfg.encoding
    # still the YAML's null (init_from came from a config file, not the command line): the
    # scaling would extend from this run's length, not the parent's
    if follows_training_length(enc, "original_max_len") and int(cfg.trainer.seq_len) != T:
        raise UserError(f"{KEY}={value}: encoding.original_max_len follows this run's trainer.seq_len "
                        f"({cfg.trainer.seq_len}) but the parent was trained at {T} — pass "
                        f"encoding.original_max_len={T} (set for you when {KEY} is on the command line)")
    return run_dir


def parent_encoding(run_dir: Path) -> str | None:
    """The encoding a parent was trained with, as its command line chose it: the group choice
    Hydra recorded (.hydra/hydra.yaml), else its config's encoding.name."""
    choice = RunDir(run_dir).choices().get("encoding")
    return str(choice) if choice else OmegaConf.select(parent_config(run_dir), "encoding.name", default=None)


def parent_overrides(overrides: list[str]) -> list[str]:
    """overrides, plus ``encoding.original_max_len=<the parent's trainer.seq_len>`` when
    trainer.init_from names a parent (or a sweep of parents trained at one length) whose
    encoding has that key, the command line keeps the parent's encoding (naming it or not) and
    does not set the key: scaling extends from the length the parent was trained at."""
    parsed = {o.key: o for o in parse_overrides(overrides)}
    init = parsed.get(KEY)
    if init is None or "encoding.original_max_len" in parsed:
        return overrides  # no parent, or set by the user
    values = init.value if init.override.is_sweep_override() else [init.value]
    run_dirs = [parent_dir(v) for v in values if requested(v)]
    if "encoding" in parsed:
        choice = parsed["encoding"]
        chosen = set(choice.value) if choice.override.is_sweep_override() else {choice.value}
        if any(chosen != {parent_encoding(d)} for d in run_dirs):
            return overrides  # another encoding than the parent's: refused by check()
    parents = [parent_config(d) for d in run_dirs]
    lengths = {int(p.trainer.seq_len) for p in parents if "original_max_len" in p.encoding}
    if len(lengths) != 1:  # none, or a sweep over parents trained at different lengths: check() asks
        return overrides
    return [*overrides, f"encoding.original_max_len={lengths.pop()}"]


def start_from_parent(cfg: DictConfig, model: torch.nn.Module, run_dir: Path, write: bool = True) -> dict:
    """Load the parent's weights into model (in place) and record the parent in run_dir;
    returns the summary's ``{"parent": ...}`` entry, or {} for a run with no parent."""

    parent = check(cfg, getattr(model, "encoding", None))
    if parent is None:
        return {}
    parent_run = RunDir(parent)
    state = parent_run.load_checkpoint()
    restore_weights(model, state, parent_run.checkpoint_to_load())  # weights only: no optimiser, step or RNG
    # the parent's model rebuilt from its checkpoint (with its own scaling, where the child changes it), compared
    checkpoint = parent_run.checkpoint_to_load()
    proved = proof.prove(model, state, str(checkpoint), parent_config(parent), cfg,
                         lambda: provenance.changes(parent_run))
    proof.say(proved)
    config = state["config"]
    record = {"path": str(parent), "step": state["step"], "tokens": state["tokens"],
              "seq_len": config["trainer"]["seq_len"], "encoding": config["encoding"].get("name"),
              proof.RECORD_KEY: {**proved, "at": f"init_from {parent}"}}
    if write:
        write_json_atomic(RunDir(run_dir).parent_file, {**record, "val": state.get("val"), "config": config})
    log.info("initialised from %s (step %d, trained at seq_len %d)", parent, state["step"], record["seq_len"])
    return {"parent": record}


def proofs(parent: dict) -> list[dict]:
    """The run's first proof (eval/proof.py): its parent's checkpoint rebuilt, where it has a parent."""
    record = parent.get("parent", {}).get(proof.RECORD_KEY)
    return [record] if record else []
