"""Causal linear attention with rotary features (RoFormer §3.3, eq. 19).

There is no score matrix, so no bias can be added: ``model.attention=linear`` refuses an
encoding that has one (judged by what it offers, not by its name).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

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
    is linear in T. q, k, v: (B, H, T, hd) -> (B, H, T, hd); computed in float32 at least (float64
    stays float64: posenc check compares paths at 1e-10, and float32 matmuls of t and T rows round
    differently, which would read as the window's length reaching the logits).
    """
    dtype, compute = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    rq, rk = rotate(phi_q, phi_k) if rotate is not None else (phi_q, phi_k)
    rq, rk = rq.to(compute), rk.to(compute)
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
