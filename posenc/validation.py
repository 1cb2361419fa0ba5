"""Refuse a bad configuration before anything is built: wrong types and out-of-range values.

Hydra accepts any override value (``trainer.max_steps=abc`` is a string), so every number the
trainer and model read is checked here, with a message naming the key and a valid value.
"""

from __future__ import annotations

from numbers import Integral, Real

from omegaconf import DictConfig

from posenc.errors import UserError

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


def validate_config(cfg: DictConfig) -> None:
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
