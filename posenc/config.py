"""posenc's configuration: where conf/ lives, its typed schema, one override parser, and
reading configs outside a run.

The YAML files under conf/ are the user's interface; the dataclasses below are their schema
(types only: the values live in the YAML, once). ``PosencConfig`` is registered in Hydra's
ConfigStore as ``posenc_schema`` and named first in conf/config.yaml's defaults list, so every
YAML (ours, an experiment's, a user's from ``--config-dir``) and every override is merged onto
typed nodes: a wrong type or an unknown key is OmegaConf's own error, raised while composing
(cli/explain.py makes it one line). The groups whose keys depend on the choice (encoding,
dataset, tokenizer) are typed by the ``__init__`` of the class ``_target_`` names
(choice_schema), so a new encoding is still one module plus one YAML. What types cannot say
(positive sizes, d_model % n_head) is the RULES table of validate.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.utils import get_class
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationToMissingValueError

from posenc.data.corpora import PACKINGS
from posenc.errors import UserError

from posenc.searchpath import CONFIG_MODULE, CONFIG_PATH, config_file, config_search_path  # noqa: F401 - re-exported
from posenc.searchpath import group_options  # noqa: F401 - re-exported: every source's options

SCHEMA_NAME = "posenc_schema"
#: groups whose keys are the constructor arguments of the class ``_target_`` names
CHOICE_GROUPS = ("encoding", "dataset", "tokenizer")


# --- the schema ---------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    seq_len: int = MISSING
    batch_size: int = MISSING
    grad_accum: int = MISSING
    max_steps: int = MISSING
    lr: float = MISSING
    min_lr_ratio: float = MISSING
    warmup_steps: int = MISSING
    weight_decay: float = MISSING
    beta1: float = MISSING
    beta2: float = MISSING
    grad_clip: float = MISSING
    log_interval: int = MISSING
    eval_interval: int = MISSING
    eval_batches: int = MISSING
    early_evals: int = MISSING                  # evaluations per eval_interval over the first 2·eval_interval steps
    checkpoint_interval: int = MISSING
    checkpoint: str = MISSING                   # last | best | none: what the run keeps (train/checkpoint.py)
    precision: str = MISSING                    # auto | bf16 | fp16 | fp32
    compile: Any = MISSING                      # auto | true | false
    peak_flops: Optional[float] = MISSING
    resume: Any = MISSING                       # false | <run dir> | auto | true
    init_from: Optional[str] = MISSING          # null | <run dir>: start from that run's weights (train/init_from.py)
    convergence_targets: List[float] = MISSING
    # resume a run whose encoding code changed since it started (posenc/provenance.py); a default
    # here so run directories written before the key load
    allow_code_change: bool = False


@dataclass
class ModelConfig:
    _target_: str = MISSING
    n_layer: int = MISSING
    n_head: int = MISSING
    d_model: int = MISSING
    dropout: float = MISSING
    attention: str = MISSING                    # softmax | linear
    flavor: str = MISSING                       # gpt2 | llama (posenc/nn/flavors.py)
    # one component of the flavour switched (null: the flavour's own), for recipe ablations;
    # defaults here so run directories written before these keys load as their flavour
    norm: Optional[str] = None                  # layernorm | rmsnorm
    mlp: Optional[str] = None                   # gelu | swiglu
    bias: Optional[bool] = None                 # biases in every linear and LayerNorm
    tie_embeddings: Optional[bool] = None       # output head = token embedding
    init: Optional[str] = None                  # gpt2 | fan_in


@dataclass
class LayerKindConfig:
    window: Optional[int] = None                # tokens a query sees, itself included; null: its whole causal past
    chunked: bool = False                       # chunks of `window` tokens (Llama 4) instead of a sliding band (Mistral)
    mixer: str = "softmax"                      # softmax | gated_delta | gla: attention or a gated linear recurrence (posenc/nn/recurrent.py)
    encoding: Dict[str, Any] = field(default_factory=dict)   # this kind's encoding: overrides of `encoding`, or a whole one with _target_


@dataclass
class LayoutConfig:
    name: str = MISSING
    window: Optional[int] = None                # the local window the presets' kinds refer to (${layout.window})
    pattern: List[str] = MISSING                # layer kinds, repeated over model.n_layer, anchored at the last layer
    kinds: Dict[str, LayerKindConfig] = MISSING


@dataclass
class EvalConfig:
    lengths: List[float] = MISSING              # multiples of trainer.seq_len (OmegaConf 2.3 iterates a List[Union] as nodes)
    stride: Optional[int] = MISSING
    packing: Optional[str] = None               # null: as dataset.packing | concat | bos_aligned | documents
    tokens: int = MISSING
    batch_tokens: int = MISSING
    at_end: bool = MISSING


@dataclass
class LoggerConfig:
    name: str = MISSING                         # wandb | none
    # W&B's keys; logger=none leaves them unused, so they have defaults here
    mode: str = "offline"
    project: str = "posenc"
    entity: Optional[str] = None
    group: Optional[str] = None
    job_type: str = "train"
    tags: List[str] = field(default_factory=list)


@dataclass
class BenchConfig:
    encodings: Optional[List[str]] = MISSING
    steps: int = MISSING
    warmup: int = MISSING
    rounds: int = MISSING
    batch_size: int = MISSING
    seq_len: int = MISSING
    peak_flops: Optional[float] = MISSING
    reference: bool = MISSING
    eval_length_multiple: int = MISSING
    document_length: Optional[int] = None       # N: every window packs documents of N tokens (documents masking)


@dataclass
class BudgetConfig:
    """conf/budget/x<f>.yaml: trainer.max_steps = steps · factor (the same batch, so f× the tokens)."""
    steps: int = MISSING                        # the ×1 budget in optimiser steps (an experiment sets it)
    factor: float = MISSING                     # 1, 2, 4: the multiple of it this run trains


@dataclass
class PosencConfig:
    seed: int = MISSING
    device: str = MISSING                       # auto | cpu | cuda | cuda:N
    name: Optional[str] = MISSING               # a sweep's name: its directory and W&B group (null: the swept keys)
    # typed per choice by choice_schema (from the _target_ class's __init__)
    encoding: Dict[str, Any] = MISSING
    model: ModelConfig = MISSING
    layout: LayoutConfig = MISSING              # local/global layers: posenc/nn/layout.py
    dataset: Dict[str, Any] = MISSING
    tokenizer: Dict[str, Any] = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = MISSING
    bench: Optional[BenchConfig] = None         # only `posenc bench` composes it
    budget: Optional[BudgetConfig] = None       # only budget=x<f> composes it (conf/budget/)


ConfigStore.instance().store(name=SCHEMA_NAME, node=PosencConfig)


def steps_times(steps: int, factor: float) -> int:
    """${posenc.times:${budget.steps},${budget.factor}}: a budget's optimiser steps."""
    return int(round(int(steps) * float(factor)))


OmegaConf.register_new_resolver("posenc.times", steps_times, replace=True)


# --- the per-choice schema: a class's __init__ is the schema of its YAML ---------------------
def _supported(annotation: Any) -> Any:
    """annotation if OmegaConf can type a field with it, else Any (Literal, unions of containers…)."""
    probe = dataclasses.make_dataclass("probe", [("x", annotation, field(default=MISSING))])
    try:
        OmegaConf.structured(probe)
    except Exception:  # noqa: BLE001 - OmegaConf says "unsupported" in several ways
        return Any
    return annotation


@lru_cache(maxsize=None)
def choice_schema(target: str) -> type | None:
    """A dataclass with one field per argument of target's ``__init__``, typed by its annotation
    (Any where it has none). Hydra's own keys (``_target_``…) are Any; a class taking
    ``**kwargs`` gets no schema (None): any key is valid for it."""
    from posenc.provenance import import_module_of

    import_module_of(target)  # a plugin module that cannot be imported: one line saying how to fix it
    cls = get_class(target)
    signature = inspect.signature(cls.__init__)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - an annotation naming what only a type checker imports
        hints = {}
    fields = [(name, _supported(hints.get(name, Any)), field(default=MISSING))
              for name, p in signature.parameters.items()
              if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    fields += [(key, Any, field(default=MISSING)) for key in ("_target_", "_partial_", "_convert_", "_recursive_")]
    return dataclasses.make_dataclass(cls.__name__, fields)


def apply_choice_schemas(cfg: DictConfig) -> DictConfig:
    """Check and type the encoding, dataset and tokenizer nodes of cfg in place against the
    schema of their ``_target_``: a wrong type or an unknown key raises OmegaConf's
    ValidationError / ConfigKeyError naming ``<group>.<key>``. Interpolations are checked
    through their value and kept as they are. A node nested in one (a mechanism's
    ``encoding.inner``) is checked against its own ``_target_`` the same way."""
    for group in CHOICE_GROUPS:
        node = cfg.get(group)
        if isinstance(node, DictConfig) and "_target_" in node:
            _apply_schema(node, group)
    return cfg


def _apply_schema(node: DictConfig, name: str) -> None:
    for key in _plain_keys(node):
        child = node[key]
        if isinstance(child, DictConfig) and "_target_" in child:
            _apply_schema(child, f"{name}.{key}")
    schema = choice_schema(node._target_)
    if schema is None:
        return
    # merged under the node's full name, so OmegaConf's error names the full key
    *path, last = name.split(".")
    wrap = lambda value: functools.reduce(lambda inner, part: {part: inner}, reversed(path), {last: value})  # noqa: E731
    typed = OmegaConf.merge(wrap(OmegaConf.structured(schema)), wrap(OmegaConf.to_container(node, resolve=True)))
    typed = OmegaConf.select(typed, name)
    for key in _plain_keys(node):
        if not isinstance(node[key], DictConfig):
            node[key] = typed[key]


def _plain_keys(node: DictConfig) -> list:
    """The keys holding a value of their own: not an interpolation (kept as written, resolved
    where it is used) and not MISSING."""
    return [k for k in node if not OmegaConf.is_interpolation(node, k) and not OmegaConf.is_missing(node, k)]


# --- one override parser -------------------------------------------------------------------
class ParsedOverride(NamedTuple):
    key: str            # 'trainer.max_steps', or a group: 'encoding', 'hydra/launcher'
    value: Any          # as Hydra types it: 100 -> 100, 1e6 -> 1000000.0; a sweep -> its list
    override: Override  # Hydra's own: .is_add(), .is_sweep_override(), .input_line, ...


def parse_overrides(overrides: list[str]) -> list[ParsedOverride]:
    """Overrides as Hydra's OverridesParser reads them (a syntax error is Hydra's
    OverrideParseException). A choice or range sweep's value is the list of its values."""
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    out = []
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        value = o.value()
        if isinstance(value, (ChoiceSweep, RangeSweep)):
            value = list(o.sweep_iterator())
        out.append(ParsedOverride(o.key_or_group, value, o))
    return out


# --- conf/ on disk ------------------------------------------------------------------------
def encoding_catalogue() -> list[tuple[str, str, dict]]:
    """(name, one-line description, options with defaults) for every encoding config."""
    out = []
    for name in group_options("encoding"):
        lines = encoding_yaml(name).splitlines()
        header = [line.lstrip("# ").strip() for line in lines[: next((i for i, l in enumerate(lines) if not l.startswith("#")), len(lines))]]
        out.append((name, " ".join(header), encoding_options(name)))
    return out


def encoding_yaml(name: str) -> str:
    """The text of encoding/NAME.yaml, from posenc's conf/ or a plugin's (posenc/searchpath.py)."""
    found = config_file(f"encoding/{name}.yaml")
    if found is None:
        raise UserError(f"no encoding '{name}' — see `posenc encodings`")
    return found.read_text()


def encoding_options(name: str) -> dict[str, object]:
    """An encoding YAML's keys with their defaults: those of the encoding it extends (a plain
    ``- fox`` entry in its defaults), the encodings it wraps (``/encoding@<key>: <name>``, chosen
    with ``encoding@encoding.<key>=…``; ``override`` changes the one it extends), then its own."""
    node = OmegaConf.create(encoding_yaml(name))
    options: dict[str, object] = {}
    for entry in node.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            options.update(encoding_options(entry))
        elif isinstance(entry, DictConfig):
            for group, choice in entry.items():
                group = str(group).removeprefix("override ")
                if group.startswith("/encoding@"):
                    options[group.split("@", 1)[1]] = choice
    raw = OmegaConf.to_container(node, resolve=False)  # as written: an interpolation stays "${...}"
    options.update({k: v for k, v in raw.items() if k not in ("_target_", "name", "defaults")})
    return options


# --- reading a config outside a Hydra run ---------------------------------------------------
def compose(overrides: list[str], bench: bool = True) -> DictConfig:
    """conf/config.yaml (+ conf/bench/default.yaml for `posenc bench`) with the user's overrides,
    outside a Hydra run (no run dir, no logging), typed by the schema. The one function every
    command but `posenc train` composes through: its search path (posenc/searchpath.py) holds
    the plugins' config directories, so a plugin's encoding is an option like a built-in one."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    GlobalHydra.instance().clear()
    try:  # Hydra's compose API, with posenc's search path instead of one config module
        hydra = Hydra.create_main_hydra2(task_name="posenc", config_search_path=config_search_path())
        cfg = hydra.compose_config("config", overrides=[*(["+bench=default"] if bench else []), *overrides],
                                   run_mode=RunMode.RUN, with_log_configuration=False)
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        del cfg["hydra"]  # as hydra.compose(return_hydra_config=False)
    return apply_choice_schemas(cfg)


def load_run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The run's config, typed by the schema, with Hydra-syntax overrides of existing keys
    (``+key=value`` adds one)."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.exists():
        raise UserError(f"{run_dir} has no .hydra/config.yaml — pass a run directory made by `posenc train`")
    saved = OmegaConf.load(path)
    if "layout" not in saved:  # runs made before layouts: every layer global
        saved["layout"] = OmegaConf.load(files(CONFIG_MODULE).joinpath("layout", "uniform.yaml").open())
    # eval keys added since the run was made (eval.packing, eval.batch_tokens) take today's defaults,
    # so the evaluators read cfg.eval.<key> with no default of their own
    saved["eval"] = OmegaConf.merge(OmegaConf.load(files(CONFIG_MODULE).joinpath("eval", "default.yaml").open()),
                                    saved.get("eval") or {})
    for group in ("model", "encoding", "dataset", "tokenizer"):  # runs made before the subpackages
        target = OmegaConf.select(saved, f"{group}._target_")
        if isinstance(target, str) and target.rpartition(".")[0] in MOVED_MODULES:
            module, _, name = target.rpartition(".")
            saved[group]["_target_"] = f"{MOVED_MODULES[module]}.{name}"
    cfg = OmegaConf.merge(OmegaConf.structured(PosencConfig), saved)
    OmegaConf.set_struct(cfg, True)  # a key the run does not have is an error, as in `posenc train`
    for key, value, o in parse_overrides(overrides):
        if isinstance(OmegaConf.select(cfg, key, default=None), DictConfig):
            raise UserError(f"'{key}' is a config group; `posenc eval` can change its keys ({key}.<key>=…), not swap it")
        OmegaConf.update(cfg, key, value, merge=False, force_add=o.is_add())
    return apply_choice_schemas(cfg)


#: where the classes named by ``_target_`` in run dirs written before 0.2 live now
MOVED_MODULES = {"posenc.model": "posenc.nn.model", "posenc.tokenizers": "posenc.data.tokenizers",
                 "posenc.corpora": "posenc.data.hub_corpora", "posenc.data": "posenc.data.corpora",
                 **{f"posenc.encodings.{m}": f"posenc.nn.encodings.{m}"
                    for m in ("alibi", "learned", "nope", "rope", "sinusoidal", "t5_bias", "xpos")}}


# --- what types cannot say ------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """key's value must satisfy holds; otherwise the error says `must be <must>` and shows example."""

    key: str
    holds: typing.Callable[[Any], bool]
    must: str
    example: Any


def _positive(key: str, example: Any) -> Rule:
    return Rule(key, lambda v: v > 0, "positive", example)


RULES: tuple[Rule, ...] = (
    *(_positive(f"trainer.{k}", e) for k, e in (
        ("seq_len", 256), ("batch_size", 16), ("grad_accum", 1), ("log_interval", 10),
        ("eval_interval", 50), ("early_evals", 4), ("eval_batches", 8), ("checkpoint_interval", 100), ("lr", 2e-3), ("grad_clip", 1.0))),
    # 0 steps: evaluate the model as it starts (a trainer.init_from parent as is, with its new scaling)
    Rule("trainer.max_steps", lambda v: v >= 0, ">= 0", 300),
    Rule("trainer.warmup_steps", lambda v: v >= 0, ">= 0", 30),
    Rule("trainer.checkpoint", lambda v: v in ("last", "best", "none"), "last, best or none", "last"),
    Rule("trainer.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]", 0.1),
    Rule("trainer.weight_decay", lambda v: v >= 0, ">= 0", 0.1),
    Rule("trainer.beta1", lambda v: 0 <= v < 1, "in [0, 1)", 0.9),
    Rule("trainer.beta2", lambda v: 0 <= v < 1, "in [0, 1)", 0.95),
    *(_positive(f"model.{k}", e) for k, e in (("n_layer", 4), ("n_head", 4), ("d_model", 256))),
    Rule("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)", 0.0),
    Rule("seed", lambda v: v >= 0, ">= 0", 0),
    # None: a dataset without packing (synthetic tasks), or eval.packing as training's
    *(Rule(key, lambda v: v is None or v in PACKINGS, f"one of {', '.join(PACKINGS)}", "documents")
      for key in ("dataset.packing", "eval.packing")),
)


def head_split_fix(d_model: int, n_head: int) -> str:
    """Two valid ways out of d_model % n_head != 0, each with an even head_dim (RoPE and xPos
    rotate pairs of dimensions, so an odd head_dim would only trade this error for theirs):
    the d_model nearest to the given one that is a multiple of 2·n_head, and the n_head nearest
    to the given one that divides d_model into an even head_dim."""
    step = 2 * n_head
    d = max(step, round(d_model / step) * step)
    divisors = {q for i in range(1, math.isqrt(d_model) + 1) if d_model % i == 0 for q in (i, d_model // i)}
    heads = [h for h in divisors if (d_model // h) % 2 == 0]
    fix = f"use model.d_model={d} (head_dim {d // n_head})"
    if heads:
        h = min(heads, key=lambda h: (abs(h - n_head), -h))
        fix += f" or model.n_head={h} (head_dim {d_model // h})"
    return fix


def _missing_keys(node: DictConfig, name: str) -> list[str]:
    """The full keys ('trainer.max_steps') of node's keys without a value. An interpolation to a
    missing key (trainer.max_steps from an unset budget.steps) is not one: the key it points to
    is reported where it lives."""
    try:
        return sorted(OmegaConf.missing_keys(node))  # full keys already
    except InterpolationToMissingValueError:
        return sorted(f"{name}.{key}" for key in node if not OmegaConf.is_interpolation(node, key)
                      and OmegaConf.is_missing(node, key))


def validate(cfg: DictConfig) -> None:
    """The rules types cannot state: every key has a value, the RULES ranges, and the shape
    rule of attention (d_model % n_head). The first one broken is a UserError saying what to do."""
    missing = [k for k in cfg if OmegaConf.is_missing(cfg, k)]
    missing += [m for k in cfg if k not in ("hydra", "bench") and not OmegaConf.is_missing(cfg, k)
                and OmegaConf.is_config(cfg[k])  # not None: an optional group not chosen (budget)
                for m in _missing_keys(cfg[k], k)]
    if missing:
        raise UserError(f"{missing[0]} has no value — set it in its conf/ YAML file or on the command line "
                        f"({missing[0]}=...)")
    for rule in RULES:
        value = OmegaConf.select(cfg, rule.key)
        if not rule.holds(value):
            raise UserError(f"{rule.key}={value} is out of range: it must be {rule.must} — "
                            f"use e.g. {rule.key}={rule.example}")
    d_model, n_head = cfg.model.d_model, cfg.model.n_head
    if d_model % n_head:
        raise UserError(f"model.d_model={d_model} is not divisible by model.n_head={n_head} — "
                        f"{head_split_fix(d_model, n_head)}")
