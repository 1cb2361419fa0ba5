"""Where posenc's Hydra configs live, and reading them outside of a run."""

from __future__ import annotations

from importlib.resources import files

from numbers import Integral, Real
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.errors import UserError

#: the top-level conf/ directory, shipped inside the package as posenc.conf
CONFIG_MODULE = "posenc.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"


def config_dir():
    return files(CONFIG_MODULE)


def group_options(group: str) -> list[str]:
    """The choices of a config group, e.g. group_options('encoding') -> ['alibi', ...]."""
    directory = config_dir().joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in directory.iterdir() if p.name.endswith(".yaml"))


def encoding_catalogue() -> list[tuple[str, str, dict]]:
    """(name, one-line description, options with defaults) for every encoding config."""
    out = []
    for name in group_options("encoding"):
        text = config_dir().joinpath("encoding", f"{name}.yaml").read_text()
        lines = text.splitlines()
        header = [line.lstrip("# ").strip() for line in lines[: next((i for i, l in enumerate(lines) if not l.startswith("#")), len(lines))]]
        doc = " ".join(header)
        node = OmegaConf.create(text)
        options = {k: node._get_node(k)._value() for k in node if k not in ("_target_", "name")}
        out.append((name, doc, options))
    return out


def compose(overrides: list[str], bench: bool = True) -> DictConfig:
    """conf/config.yaml (+ conf/bench/default.yaml for `posenc bench`) with the user's overrides,
    outside a Hydra run (no run dir, no logging)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return hydra_compose("config", overrides=[*(["+bench=default"] if bench else []), *overrides])


def load_run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The run's config with Hydra-syntax overrides of existing keys (``+key=value`` adds one)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = run_dir / ".hydra" / "config.yaml"
    if not path.exists():
        raise UserError(f"{run_dir} has no .hydra/config.yaml — pass a run directory made by `posenc train`")
    cfg = OmegaConf.load(path)
    for group in ("model", "encoding", "dataset", "tokenizer"):  # runs made before the subpackages
        target = OmegaConf.select(cfg, f"{group}._target_")
        if isinstance(target, str) and target.rpartition(".")[0] in MOVED_MODULES:
            module, _, name = target.rpartition(".")
            cfg[group]["_target_"] = f"{MOVED_MODULES[module]}.{name}"
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.key_or_group
        exists = OmegaConf.select(cfg, key, default=_MISSING) is not _MISSING
        if not exists and not o.is_add():
            raise UserError(f"unknown config key '{key}' — check the spelling, or write +{key}=... to add it")
        if isinstance(OmegaConf.select(cfg, key, default=None), DictConfig):
            raise UserError(f"'{key}' is a config group; `posenc eval` can change its keys ({key}.<key>=…), not swap it")
        OmegaConf.update(cfg, key, o.value(), force_add=o.is_add())
    return cfg


_MISSING = object()
#: where the classes named by ``_target_`` in run dirs written before 0.2 live now
MOVED_MODULES = {"posenc.model": "posenc.nn.model", "posenc.tokenizers": "posenc.data.tokenizers",
                 "posenc.corpora": "posenc.data.hub_corpora", "posenc.data": "posenc.data.corpora",
                 **{f"posenc.encodings.{m}": f"posenc.nn.encodings.{m}"
                    for m in ("alibi", "learned", "nope", "rope", "sinusoidal", "t5_bias", "xpos")}}

#: trainer keys that must be positive integers
POSITIVE_INTS = ("seq_len", "batch_size", "grad_accum", "max_steps", "eval_interval", "eval_batches",
                 "log_interval", "checkpoint_interval")
#: model keys that must be positive integers
MODEL_INTS = ("n_layer", "n_head", "d_model")


def _int(value, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise UserError(f"{key}={value!r} is not an integer — write e.g. {key}={max(minimum, 1) * 8}")
    if value < minimum:
        bound = "positive" if minimum == 1 else f">= {minimum}"
        raise UserError(f"{key} must be {bound}, got {value} — use a {bound} value" if minimum == 1 else f"{key} must be {bound}, got {value} — use a value {bound}")
    return int(value)


def _real(value, key: str, low: float, high: float | None = None, low_open: bool = False,
          high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise UserError(f"{key}={value!r} is not a number — write e.g. {key}={low if not low_open else 0.1}")
    too_low = value <= low if low_open else value < low
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        interval = f"{left}{low}, {high if high is not None else '∞'}{right}"
        raise UserError(f"{key}={value} is out of range — use a value in {interval}")
    return float(value)


def validate(cfg: DictConfig) -> None:
    """Check the trainer's and model's numbers: types, signs, and the shape rules of attention."""
    t, m = cfg.trainer, cfg.model
    for key in POSITIVE_INTS:
        _int(t[key], f"trainer.{key}", 1)
    _int(t.warmup_steps, "trainer.warmup_steps", 0)
    _real(t.lr, "trainer.lr", 0.0, low_open=True)
    _real(t.min_lr_ratio, "trainer.min_lr_ratio", 0.0, 1.0)
    _real(t.weight_decay, "trainer.weight_decay", 0.0)
    _real(t.beta1, "trainer.beta1", 0.0, 1.0, high_open=True)
    _real(t.beta2, "trainer.beta2", 0.0, 1.0, high_open=True)
    _real(t.grad_clip, "trainer.grad_clip", 0.0, low_open=True)
    for key in MODEL_INTS:
        _int(m[key], f"model.{key}", 1)
    _real(m.dropout, "model.dropout", 0.0, 1.0, high_open=True)
    if m.d_model % m.n_head:
        raise UserError(f"model.d_model={m.d_model} is not divisible by model.n_head={m.n_head} — "
                        f"pick d_model a multiple of n_head (e.g. {m.n_head * max(1, m.d_model // m.n_head)})")
    _int(cfg.seed, "seed", 0)
