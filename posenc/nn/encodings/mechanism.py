"""A mechanism that wraps another encoding: position through the attention itself, composed with
any positional encoding (FoX with or without RoPE, SSMax or a sink on top of any encoding).

``Mechanism(inner)`` takes its sizes (d_model, n_head) from ``inner`` and passes every hook of the
base contract through to it, adding its own: a subclass overrides the hook it contributes and
combines it with the inner one (``decay`` adds, ``logit_scale`` multiplies, ``sink_logit`` joins
as log(e^a + e^b)). What the wrapper offers is what the inner encoding offers plus what the
subclass overrides, so attention still derives every path from ``offers`` and never learns a name.

A kernel of the inner encoding's own (``fused_attention``) computes what the inner encoding
defines, so it passes through only a mechanism that adds nothing but hooks on q and k (``ON_QK``:
attention applies them before any kernel), as SSMax's logit scale; a mechanism with a kernel of its
own asks ``inner_acts_on_qk`` whether that kernel, given the transformed q and k, covers the inner
encoding too (FoX-RoPE), or composes with the inner kernel (PaTH-FoX: FoX's gates given to PaTH's).

The inner encoding is a config node of its own (Hydra's defaults list puts conf/encoding/<x>.yaml
under ``encoding.inner``; choose it with ``encoding@encoding.inner=rope`` and set its keys as
``encoding.inner.base=500``); posenc/build.py builds it first and hands it to the wrapper.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.nn.encodings.base import (
    HOOKS,
    Context,
    FusedAttention,
    PositionalEncoding,
    ScoreMod,
    ScoreRows,
)
from posenc.nn.encodings.cache import LayerCache, holds
from posenc.nn.mask import Window

#: the hooks that act on q and k (or the embeddings) before attention: a kernel given the transformed,
#: scaled q and k has computed them already
ON_QK = ("embed", "transform_qk", "logit_scale", "rotary_frequencies")


class Mechanism(PositionalEncoding):
    """Every hook passed through to ``inner``; subclasses add their own (see the module doc)."""

    def __init__(self, inner: PositionalEncoding, name: str, n_layer: int | None = None) -> None:
        """n_layer: for a mechanism with parameters per layer (the builder passes model.n_layer)."""
        if not isinstance(inner, PositionalEncoding):
            raise ValueError(f"encoding.inner is an encoding config of its own, not a value: choose it with "
                             f"encoding@encoding.inner={inner} (and set its keys with encoding.inner.<key>=…)")
        super().__init__(inner.d_model, inner.n_head, name)
        if inner.for_layer(0) is not inner:
            raise ValueError(f"encoding.inner '{inner.name}' gives layers encodings of their own; "
                             f"wrap a single encoding (choose per-layer encodings with layout=…)")
        if n_layer is not None and n_layer <= 0:
            raise ValueError(f"model.n_layer must be positive, got {n_layer}")
        self.inner = inner
        self.max_len = inner.max_len
        self.reach = inner.reach

    def parameter_scale(self, key: str, value: float | None) -> float:
        """A factor a learned logit enters with (``encoding.<key>``): so that one Adam step of
        about lr moves the logit by about value·lr; null: √head_dim."""
        if value is not None and not value > 0:
            raise ValueError(f"encoding.{key} must be > 0 (null: √head_dim), got {value}")
        return float(value) if value is not None else math.sqrt(self.head_dim)

    def overrides(self, hook: str) -> bool:
        """Whether this mechanism itself (not its inner encoding) acts through ``hook``."""
        return getattr(type(self), hook) is not getattr(Mechanism, hook)

    def offers(self, hook: str) -> bool:
        return super().offers(hook) or self.inner.offers(hook)

    # --- the inner encoding's hooks, passed through ------------------------------------
    def embed(self, x: Tensor, ctx: Context) -> Tensor:
        return self.inner.embed(x, ctx)

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> tuple[Tensor, Tensor]:
        return self.inner.transform_qk(q, k, ctx, layer)

    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.inner.position_bias(q_pos, k_pos)

    def distance_bias(self, distance: Tensor) -> Tensor:
        return self.inner.distance_bias(distance)

    def rotary_frequencies(self, layer: int = 0) -> Tensor | None:
        return self.inner.rotary_frequencies(layer)

    def score_mod(self, ctx: Context) -> ScoreMod | None:
        return self.inner.score_mod(ctx)

    def content_bias(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> Tensor:
        return self.inner.content_bias(q, k, ctx, layer)

    def qk_scores(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> ScoreRows:
        return self.inner.qk_scores(q, k, ctx, layer)

    def decay(self, ctx: Context, layer: int = 0) -> Tensor | None:
        return self.inner.decay(ctx, layer)

    def logit_scale(self, ctx: Context, layer: int = 0) -> Tensor | None:
        return self.inner.logit_scale(ctx, layer)

    def sink_logit(self, layer: int = 0) -> Tensor | None:
        return self.inner.sink_logit(layer)

    def normalise(self, scores: Tensor, q_idx: Tensor, k_idx: Tensor) -> Tensor:
        return self.inner.normalise(scores, q_idx, k_idx)

    def fused_attention(self, ctx: Context, layer: int = 0, log_gates: bool = False) -> FusedAttention | None:
        """The inner encoding's kernel, where this mechanism adds nothing but hooks on q and k."""
        if any(self.overrides(hook) for hook in HOOKS if hook not in ON_QK) or not self.inner.offers("fused_attention"):
            return None
        return self.inner.fused_attention(ctx, layer, log_gates)

    def inner_acts_on_qk(self) -> bool:
        """Whether the inner encoding acts on q and k alone (NoPE, RoPE): a kernel of this mechanism
        given the transformed q and k then computes the inner encoding as well."""
        return not any(self.inner.offers(hook) for hook in HOOKS if hook not in ON_QK)

    # --- what the inner hook gives, for a subclass to combine with its own ----------------
    def inner_decay(self, ctx: Context, layer: int) -> Tensor | None:
        return self.inner.decay(ctx, layer) if self.inner.offers("decay") else None

    def inner_logit_scale(self, ctx: Context, layer: int) -> Tensor | None:
        return self.inner.logit_scale(ctx, layer) if self.inner.offers("logit_scale") else None

    def inner_sink_logit(self, layer: int) -> Tensor | None:
        return self.inner.sink_logit(layer) if self.inner.offers("sink_logit") else None

    # --- decoding ---------------------------------------------------------------------------
    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The inner encoding's cache, asking this mechanism for the terms every cache computes alike
        (bias, logit scale, sink, normaliser: a sink or stick-breaking needs nothing kept); a mechanism
        that keeps more (FoX's gates, PaTH's carried keys) wraps it or writes its own."""
        inner = self.inner.kv_cache(layer, window)
        return None if inner is None else inner.retarget(self)

    def cache_holds(self) -> bool:
        return holds(self) and self.inner.cache_holds()

    def cache_epoch(self, length: int) -> object:
        return self.inner.cache_epoch(length)

    def stale_cache(self) -> str | None:
        return self.inner.stale_cache()

    def prepare(self, length: int) -> None:
        self.inner.prepare(length)

    def check_length(self, length: int) -> None:
        self.inner.check_length(length)

    def options(self) -> dict[str, object]:
        return {"inner": {"name": self.inner.name, **self.inner.options()}}


def combine_sinks(a: Tensor | None, b: Tensor) -> Tensor:
    """Two sinks are one: exp(a) + exp(b) = exp(log(e^a + e^b))."""
    return b if a is None else torch.logaddexp(a, b)
