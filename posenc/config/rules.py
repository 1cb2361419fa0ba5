"""What types cannot say: positive sizes, ranges, every key set, d_model % n_head; ``validate``
raises the first one broken as a UserError saying what to do."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError

from posenc.data.corpora import PACKINGS
from posenc.errors import UserError


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
