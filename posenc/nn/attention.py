"""Causal softmax attention. Kernels see an encoding only through what it offers: no bias, a
position bias (optionally also as a FlexAttention ``score_mod``), a content bias.

Which kernel runs is chosen from those offers and from what the device can do
(``select_kernel``), never from the encoding's name (docs/architecture.md, "Attention paths"):

- no bias: ``F.scaled_dot_product_attention(is_causal=True)`` (flash / cuDNN / memory-efficient);
- a position bias on CUDA, offered as a score_mod: FlexAttention with a causal BlockMask
  (posenc.nn.flex), which computes the bias per score: no H x T x T tensor, forward or backward;
- otherwise (CPU, or a CUDA fallback, said once in a warning): SDPA with a float mask, the
  causal mask folded in as -inf. Short sequences build the (1, H, T, T) mask once per forward
  and share it across layers; long ones (evaluation far beyond the training length) chunk the
  queries, so memory grows as H · chunk · T, never H · T²;
- a content bias (computed from q and k, e.g. CoPE): added to the float mask in each layer.
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
from posenc.nn.flex import FlexBias

#: above this many positions a biased attention is computed in query chunks
DENSE_BIAS_MAX_LEN = 2048
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
    """The kernel for a position bias: ("flex" | "sdpa", why not flex on CUDA or None).

    FlexAttention is the CUDA path; on CPU it has no backward (torch 2.13), so SDPA with a
    float mask is the designed path there, not a fallback."""
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


def causal_mask_bias(bias: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Fold the causal mask into an additive bias: -inf where key is after query.

    bias: (..., Tq, Tk), q_pos: (Tq,), k_pos: (Tk,) -> same shape, in bias's dtype.
    """
    future = k_pos[None, :] > q_pos[:, None]  # (Tq, Tk)
    return bias.masked_fill(future, float("-inf"))


@dataclass
class DenseBias:
    """A position bias for one forward pass, shared by every layer, for SDPA's float mask.

    fn(q_pos, k_pos) -> (H, Tq, Tk); dense is the whole causal float mask (1, H, T, T) when
    the sequence is short enough to hold it, else None and attention chunks the queries.
    """

    fn: Callable[[Tensor, Tensor], Tensor]
    pos: Tensor  # (T,)
    dense: Tensor | None = None

    @classmethod
    def build(cls, fn: Callable[[Tensor, Tensor], Tensor], pos: Tensor, dtype: torch.dtype) -> DenseBias:
        dense = None
        if pos.shape[0] <= DENSE_BIAS_MAX_LEN:
            dense = causal_mask_bias(fn(pos, pos), pos, pos).to(dtype)[None]  # (1, H, T, T)
        return cls(fn=fn, pos=pos, dense=dense)

    def mask(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
        """Rows start..end of the causal float mask, keys 0..end: (1, H, end - start, end)."""
        if self.dense is not None:
            return self.dense[:, :, start:end, :end].to(dtype)
        q_pos, k_pos = self.pos[start:end], self.pos[:end]
        return causal_mask_bias(self.fn(q_pos, k_pos), q_pos, k_pos).to(dtype)[None]


#: how a position bias reaches attention in one forward
PositionBias = DenseBias | FlexBias | None


def position_bias(encoding: PositionalEncoding, ctx: Context, dropout_p: float) -> PositionBias:
    """The encoding's position bias for this forward, in the form the chosen kernel takes
    (one warning when a CUDA run falls back from FlexAttention); None when it has none."""
    if not encoding.has_bias:
        return None
    if encoding.has_content_bias:  # its per-layer term joins the float mask, so the bias does too
        return DenseBias.build(encoding.bias, ctx.pos, ctx.dtype)
    score_mod = encoding.score_mod(ctx) if ctx.device.type == "cuda" else None
    kernel, why_not = select_kernel(ctx.device.type, encoding.head_dim, dropout_p, score_mod is not None)
    if kernel == "flex":
        return FlexBias(score_mod, flex.causal_block_mask(ctx.T, ctx.device))
    if why_not:
        warn_once(f"encoding '{encoding.name}': biased attention falls back from FlexAttention to SDPA with a "
                  f"float mask (slower, O(H·T²) memory per layer) because {why_not}")
    return DenseBias.build(encoding.bias, ctx.pos, ctx.dtype)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, bias: PositionBias = None, dropout_p: float = 0.0,
                     content: Tensor | None = None, pos: Tensor | None = None) -> Tensor:
    """Causal softmax attention. q, k, v: (B, H, T, hd) -> (B, H, T, hd).

    bias: the forward's position bias; content: (B, H, T, T) content bias of this layer, with
    pos (T,) the positions its causal mask is folded in at."""
    if content is not None:
        mask = content if bias is None else content + bias.mask(0, q.shape[-2], content.dtype)
        if bias is None:
            mask = causal_mask_bias(mask, pos, pos)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if isinstance(bias, FlexBias):
        return bias.attend(q, k, v)
    if bias.dense is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.dense, dropout_p=dropout_p)
    return chunked_biased_attention(q, k, v, bias, dropout_p)


def chunked_biased_attention(q: Tensor, k: Tensor, v: Tensor, bias: DenseBias, dropout_p: float = 0.0,
                             chunk: int | None = None) -> Tensor:
    """Biased causal attention over query chunks: chunk i attends to keys [0, end_i) only,
    with its (H, chunk, end_i) slice of the bias computed on the fly."""
    chunk = chunk or QUERY_CHUNK
    T = q.shape[-2]
    out = torch.empty_like(q)
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        out[:, :, start:end] = F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, :end], v[:, :, :end], attn_mask=bias.mask(start, end, q.dtype),
            dropout_p=dropout_p)
    return out
