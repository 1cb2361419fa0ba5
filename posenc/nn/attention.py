"""Attention kernels. They see an encoding only through what it offers: no bias, a bias, or a
bias it can also compute on the fly (a FlexAttention ``score_mod``).

- no bias: ``F.scaled_dot_product_attention(is_causal=True)`` (flash / memory-efficient);
- linear (``model.attention=linear``): causal linear attention, RoFormer §3.3, with the
  encoding's ``rotate`` applied to the features φ(q), φ(k); no score matrix, so no bias;
- a bias on CUDA, offered as a score_mod: FlexAttention with a causal BlockMask (posenc.nn.flex);
- a bias otherwise: SDPA with a float mask, the causal mask folded in as -inf. Short sequences
  build the (1, H, T, T) mask once per forward and share it across layers; long ones
  (evaluation far beyond the training length) chunk the queries so no H x T x T tensor
  is ever materialised: memory grows as H · chunk · T.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.flex import FlexBias, flex_bias, warn_once

#: above this many positions a biased attention is computed in query chunks
DENSE_BIAS_MAX_LEN = 2048
#: query rows per chunk in the chunked path
QUERY_CHUNK = 512


def causal_mask_bias(bias: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Fold the causal mask into an additive bias: -inf where key is after query.

    bias: (H, Tq, Tk), q_pos: (Tq,), k_pos: (Tk,) -> (H, Tq, Tk) in bias's dtype.
    """
    future = k_pos[None, :] > q_pos[:, None]  # (Tq, Tk)
    return bias.masked_fill(future, float("-inf"))


@dataclass
class ScoreBias:
    """An encoding's additive score bias for one forward pass, shared by every layer.

    fn(q_pos, k_pos) -> (H, Tq, Tk); dense is the whole causal float mask (1, H, T, T)
    when the sequence is short enough to hold it, else None and attention chunks.
    """

    fn: Callable[[Tensor, Tensor], Tensor]
    pos: Tensor  # (T,)
    dense: Tensor | None = None

    @classmethod
    def build(
        cls, fn: Callable[[Tensor, Tensor], Tensor], pos: Tensor, dtype: torch.dtype
    ) -> ScoreBias:
        dense = None
        if pos.shape[0] <= DENSE_BIAS_MAX_LEN:
            dense = causal_mask_bias(fn(pos, pos), pos, pos).to(dtype)[None]  # (1, H, T, T)
        return cls(fn=fn, pos=pos, dense=dense)


def attention_bias(
    encoding: PositionalEncoding, pos: Tensor, length: int, dtype: torch.dtype, dropout_p: float
) -> ScoreBias | FlexBias | None:
    """How the encoding's bias reaches attention in this forward, chosen from what the encoding
    offers and the device (DESIGN.md, "Attention paths"); None when it has no bias."""
    if not encoding.has_bias:
        return None
    if pos.device.type == "cuda":
        if dropout_p > 0:
            warn_once("FlexAttention has no attention dropout; with model.dropout > 0 a biased "
                      "encoding trains with SDPA and a float mask (slower, O(H·T²) memory per layer)")
        elif (flex := flex_bias(encoding, pos, length)) is not None:
            return flex
    return ScoreBias.build(encoding.bias, pos, dtype)


def causal_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias | FlexBias | None = None, dropout_p: float = 0.0
) -> Tensor:
    """Causal softmax attention. q, k, v: (B, H, T, hd) -> (B, H, T, hd)."""
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if isinstance(bias, FlexBias):
        return bias.attend(q, k, v)
    if bias.dense is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.dense, dropout_p=dropout_p)
    return chunked_biased_attention(q, k, v, bias, dropout_p)


def chunked_biased_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias, dropout_p: float = 0.0, chunk: int = QUERY_CHUNK
) -> Tensor:
    """Biased causal attention over query chunks: chunk i attends to keys [0, end_i) only,
    with its (H, chunk, end_i) slice of the bias computed on the fly."""
    T = q.shape[-2]
    out = torch.empty_like(q)
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        q_pos, k_pos = bias.pos[start:end], bias.pos[:end]
        mask = causal_mask_bias(bias.fn(q_pos, k_pos), q_pos, k_pos).to(q.dtype)  # (H, c, end)
        out[:, :, start:end] = F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, :end], v[:, :, :end], attn_mask=mask[None], dropout_p=dropout_p
        )
    return out


#: positions per chunk of causal linear attention (quadratic inside a chunk, a running sum across)
LINEAR_CHUNK = 64


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 > 0 (Katharopoulos et al., 2020), the feature map of RoFormer §3.3."""
    return F.elu(x) + 1.0


def causal_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rotate: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
    chunk: int = LINEAR_CHUNK,
    eps: float = 1e-6,
) -> Tensor:
    """Causal linear attention with rotary features, RoFormer eq. (19):

        out_m = Σ_{n<=m} (R_m φ(q_m))ᵀ (R_n φ(k_n)) v_n  /  Σ_{n<=m} φ(q_m)ᵀ φ(k_n)

    The numerator uses the rotated features (relative position), the normaliser the unrotated
    ones (so it stays positive). Computed chunk by chunk: masked quadratic inside a chunk, a
    running state S = Σ (R_n φ(k_n)) v_nᵀ (hd x hd) and z = Σ φ(k_n) across chunks, so memory
    is linear in T. q, k, v: (B, H, T, hd) -> (B, H, T, hd); computed in float32.
    """
    dtype = v.dtype
    q, k, v = q.float(), k.float(), v.float()
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    rq, rk = rotate(phi_q, phi_k) if rotate is not None else (phi_q, phi_k)
    rq, rk = rq.float(), rk.float()
    B, H, T, hd = q.shape
    state = q.new_zeros(B, H, hd, v.shape[-1])  # Σ_{n < chunk start} R_n φ(k_n) v_nᵀ
    norm = q.new_zeros(B, H, hd)  # Σ_{n < chunk start} φ(k_n)
    outs = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        causal = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device).tril()
        scores = (rq[..., start:end, :] @ rk[..., start:end, :].transpose(-1, -2)).masked_fill(~causal, 0.0)
        weights = (phi_q[..., start:end, :] @ phi_k[..., start:end, :].transpose(-1, -2)).masked_fill(~causal, 0.0)
        numerator = scores @ v[..., start:end, :] + rq[..., start:end, :] @ state  # (B, H, c, hd)
        denominator = weights.sum(-1) + (phi_q[..., start:end, :] @ norm[..., None]).squeeze(-1)  # (B, H, c)
        outs.append(numerator / denominator[..., None].clamp_min(eps))
        state = state + rk[..., start:end, :].transpose(-1, -2) @ v[..., start:end, :]
        norm = norm + phi_k[..., start:end, :].sum(-2)
    return torch.cat(outs, dim=-2).to(dtype)
