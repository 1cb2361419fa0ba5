"""Softmax attention under a mask, with an optional position bias. Kernels see an encoding only
through what it offers (a position bias, optionally as a FlexAttention ``score_mod``; a content
bias) and the layer only through its mask (posenc/nn/mask.py: causal, documents, a window).

Which kernel runs is chosen from those offers and from what the device can do (``plan``),
never from the encoding's name (docs/architecture.md, "Attention paths"):

- no bias, causal only: ``F.scaled_dot_product_attention(is_causal=True)`` (flash / cuDNN /
  memory-efficient), the fast common case;
- on CUDA, a bias offered as a score_mod and/or a mask beyond causality: FlexAttention with the
  mask's ``BlockMask``, built once per forward and shared by every layer with that mask, so
  masked blocks are skipped (posenc.nn.flex): no H x T x T tensor, forward or backward;
- otherwise (CPU, or a CUDA fallback, said once in a warning): SDPA with an explicit mask —
  boolean where there is no bias, the float bias with -inf on hidden keys where there is one.
  Short sequences build it once per forward and share it across layers; long ones (evaluation
  far beyond the training length) compute it for a chunk of queries at a time, and a window
  limits each chunk's keys, so memory grows as H · chunk · keys, never H · T²;
- a content bias (computed from q and k, e.g. CoPE): added to the explicit mask in each layer.

Under document masking a bias that depends on positions only through i - j is computed at window
indices (``Context.at_indices``): inside a document i - j is the difference of the indices and
pairs across documents are masked, so it is the same bias with no per-sequence gather.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn import flex
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.flex import FlexPlan
from posenc.nn.mask import AttentionMask

#: above this many positions an explicit mask is computed in query chunks
DENSE_MAX_LEN = 2048
#: query rows per chunk in the chunked path
QUERY_CHUNK = 512
#: FlexAttention's kernels need a head dimension of at least this
FLEX_MIN_HEAD_DIM = 16

_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """One warning per distinct reason per process, not one per forward."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def select_kernel(device_type: str, head_dim: int, dropout_p: float, offers_score_mod: bool,
                  flex_available: bool = flex.AVAILABLE) -> tuple[str, str | None]:
    """The kernel for a bias or a mask beyond causality: ("flex" | "sdpa", why not flex on CUDA
    or None). FlexAttention is the CUDA path; on CPU it has no backward (torch 2.13), so SDPA
    with an explicit mask is the designed path there, not a fallback."""
    if device_type != "cuda":
        return "sdpa", None
    if not flex_available:
        return "sdpa", "FlexAttention is not available in this torch (upgrade torch to >= 2.5)"
    if head_dim < FLEX_MIN_HEAD_DIM:
        return "sdpa", (f"FlexAttention needs head_dim >= {FLEX_MIN_HEAD_DIM}, this model has {head_dim} "
                        f"(raise model.d_model / model.n_head)")
    if dropout_p > 0:
        return "sdpa", "FlexAttention has no attention dropout (model.dropout > 0)"
    if not offers_score_mod:
        return "sdpa", "the encoding offers no score_mod"
    return "flex", None


@dataclass
class DensePlan:
    """One layer kind's scores for SDPA's explicit mask: the mask alone (boolean) or the bias
    with -inf on hidden keys (float), shared by every layer with this encoding and mask.

    fn(q_pos, k_pos) -> (..., H, Tq, Tk) or None; pos: (T,) or (B, T) what fn sees; dense: the
    whole mask, (B|1, 1|H, T, T), when the sequence is short enough to hold it, else None and
    attention computes ``rows`` for a chunk of queries at a time."""

    mask: AttentionMask
    fn: Callable[[Tensor, Tensor], Tensor] | None
    pos: Tensor
    dtype: torch.dtype
    dense: Tensor | None = None

    @classmethod
    def build(cls, mask: AttentionMask, fn: Callable[[Tensor, Tensor], Tensor] | None, pos: Tensor,
              dtype: torch.dtype) -> DensePlan:
        plan = cls(mask, fn, pos, dtype)
        if mask.T <= DENSE_MAX_LEN:
            plan.dense = plan.rows(0, mask.T, 0)
        return plan

    def rows(self, start: int, end: int, lo: int) -> Tensor:
        """The mask of queries start..end-1 over keys lo..end-1: (B|1, 1|H, end - start, end - lo)."""
        if self.dense is not None:
            return self.dense[..., start:end, lo:end]
        visible = self.mask.visible(start, end, lo, end, device=self.pos.device)  # (B|1, 1, rows, keys)
        if self.fn is None:
            return visible
        bias = self.fn(self.pos[..., start:end], self.pos[..., lo:end])  # (..., H, rows, keys)
        return bias.masked_fill(~visible, float("-inf")).to(self.dtype)


#: how one layer's attention is computed in one forward: None is SDPA's is_causal fast path
Plan = DensePlan | FlexPlan | None


def plan(encoding: PositionalEncoding, ctx: Context, layer: int, dropout_p: float) -> Plan:
    """How block ``layer`` attends in this forward, from what its encoding offers, its mask and
    the device (one warning when a CUDA run falls back from FlexAttention)."""
    mask = ctx.mask(layer)
    if not encoding.has_bias and not encoding.has_content_bias and mask.causal_only:
        return None
    bias_ctx = ctx.at_indices() if ctx.doc is not None and encoding.is_relative else ctx
    fn = encoding.bias if encoding.has_bias else None
    if encoding.has_content_bias:  # its per-layer term joins the explicit mask, so the bias does too
        return DensePlan.build(mask, fn, bias_ctx.pos, ctx.dtype)
    if ctx.device.type == "cuda":
        score_mod = encoding.score_mod(bias_ctx) if fn is not None else None
        kernel, why_not = select_kernel("cuda", encoding.head_dim, dropout_p, fn is None or score_mod is not None)
        if kernel == "flex":
            return FlexPlan(score_mod, mask.block_mask(ctx.device))
        what = f"encoding '{encoding.name}'" if fn is not None else f"the {mask.window.describe()} mask"
        warn_once(f"{what}: attention falls back from FlexAttention to SDPA with an explicit mask "
                  f"(slower, O(H·T²) memory per layer) because {why_not}")
    return DensePlan.build(mask, fn, bias_ctx.pos, ctx.dtype)


def plans(encoding: PositionalEncoding, ctx: Context, n_layer: int, dropout_p: float) -> list[Plan]:
    """Every block's plan for one forward; layers with the same encoding and mask share one (a
    position bias is computed once per forward and shared, as T5 does)."""
    shared: dict[tuple[int, int], Plan] = {}
    out = []
    for layer in range(n_layer):
        layer_encoding = encoding.for_layer(layer)
        key = (id(layer_encoding), id(ctx.mask(layer)) if ctx.masks else -1)
        if key not in shared:
            shared[key] = plan(layer_encoding, ctx, layer, dropout_p)
        out.append(shared[key])
    return out


def attend(q: Tensor, k: Tensor, v: Tensor, plan: Plan = None, dropout_p: float = 0.0,
           content: Tensor | None = None) -> Tensor:
    """Softmax attention of one layer. q, k, v: (B, H, T, hd) -> (B, H, T, hd).

    plan: the layer's plan for this forward; content: (B, H, T, T) content bias of this layer."""
    if plan is None and content is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if isinstance(plan, FlexPlan):
        return plan.attend(q, k, v)
    if plan is None:  # a content bias alone: causal over the window
        plan = DensePlan.build(AttentionMask(q.shape[-2]), None, torch.arange(q.shape[-2], device=q.device), q.dtype)
    T = q.shape[-2]
    chunk = T if plan.dense is not None else QUERY_CHUNK
    out = torch.empty_like(q) if chunk < T else None
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        lo = plan.mask.key_range(start, end)[0] if chunk < T else 0
        mask = plan.rows(start, end, lo)
        if content is not None:
            mask = with_content(mask, content[..., start:end, lo:end])
        y = F.scaled_dot_product_attention(q[..., start:end, :], k[..., lo:end, :], v[..., lo:end, :],
                                           attn_mask=mask.to(q.dtype) if mask.is_floating_point() else mask,
                                           dropout_p=dropout_p)
        if out is None:
            return y
        out[..., start:end, :] = y
    return out


def with_content(mask: Tensor, content: Tensor) -> Tensor:
    """A content bias (B, H, rows, keys) joined to an explicit mask: added to a float mask
    (whose hidden keys are -inf already), or -inf where a boolean mask hides the key."""
    if mask.dtype == torch.bool:
        return content.masked_fill(~mask, float("-inf"))
    return content + mask.to(content.dtype)
