"""Gated linear recurrences: the token mixers of the recurrent layer kinds (posenc/nn/recurrent.py).

A state matrix S (d_v x d_k per head) is carried along the sequence and read by the query:

- gated delta rule (Gated DeltaNet, Yang et al., ICLR 2025; Qwen3-Next, Kimi Linear's KDA with
  per-channel gates):  S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,  o_t = S_t q_t;
- scalar-decay gated linear attention (Mamba-2's SSD, GLA / fla's simple_gla):
  S_t = α_t S_{t-1} + v_t k_tᵀ,  o_t = S_t q_t;

with α_t = exp(g_t) in (0, 1] a scalar per head and token (g_t <= 0, the log decay) and
β_t in (0, 1) the delta rule's writing strength. q is taken as given (any 1/√d_k scale is the
caller's). Documents packing resets the state at every document (fla's ``cu_seqlens``): ``seg``
(B, T) holds non-decreasing segment ids, and S is zero before each segment's first token.

Two forms, equal in exact arithmetic (tests/test_recurrent.py, against fla's own naive
references too):

- ``recurrent_*``: the recurrence token by token, the definition (tests; O(T) Python steps);
- ``chunked_*``: chunks of C tokens (C = 32). Inside a chunk, with b_t = Σ_{s<=t} g_s the
  within-chunk cumulative log decay, the decays between tokens are D_tj = exp(b_t - b_j) (j <= t,
  same segment) and the chunk reads the state S_0 it starts from:

      o_t = e^{b_t} S_0 q_t + Σ_{j<=t} D_tj (q_t·k_j) u_j,     S_C = e^{b_C} S_0 + Σ_j D_Cj u_j k_jᵀ

  where u_j = v_j for GLA and, for the delta rule, the corrected values
  u_t = β_t (v_t - α_t S_{t-1} k_t), found for the whole chunk by one unit-lower-triangular solve
  (the WY / UT representation of Yang et al., 2024): (I + A) U = diag(β) V - diag(β e^b) K S_0ᵀ with
  A_tj = β_t D_tj (k_t·k_j) for j < t. Every chunk's intra-chunk terms are computed at once; only
  the state passes from chunk to chunk (T/C small matmuls), so memory is linear in T. The solve
  and the state pass have hand-written backwards (posenc/nn/chunkwise.py).

Both compute in at least float32 with autocast off (posenc/nn/precision.py), as fla does: under
bf16 autocast the inputs are cast up, and the chunked form returns v's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn.chunkwise import final_state, state_pass, unit_lower_solve
from posenc.nn.cumsum import cumsum
from posenc.nn.precision import without_autocast

#: tokens per chunk: 32 (fla's kernels take 64); on a CPU the per-chunk solve and the C x C
#: decay products grow as C²: the gated delta rule's forward and backward took 25% more CPU time
#: at C = 64, and no less at C = 16, which doubles the chunk-to-chunk steps (docs/hybrids.md, Cost)
CHUNK = 32


def _starts(seg: Tensor | None, B: int, T: int, device: torch.device) -> Tensor:
    """(B, T) bool: where a segment starts (token 0 always)."""
    out = torch.zeros(B, T, dtype=torch.bool, device=device)
    out[:, 0] = True
    if seg is not None:
        out[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return out


def gated_delta_step(S: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule: S (B, H, dv, dk), q, k (B, H, dk), v (B, H, dv), g = log α and
    β (B, H) -> (o_t = S_t q_t (B, H, dv), S_t = α_t S (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ)."""
    b = beta[..., None, None]
    Sk = S @ k[..., :, None]  # (B, H, dv, 1): S (I - β k kᵀ) = S - β (S k) kᵀ
    S = g[..., None, None].exp() * (S - b * Sk * k[..., None, :]) + b * v[..., :, None] * k[..., None, :]
    return (S @ q[..., :, None])[..., 0], S


def gla_step(S: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """One token of scalar-decay GLA: S_t = α_t S + v_t k_tᵀ, o_t = S_t q_t (shapes as ``gated_delta_step``)."""
    S = g[..., None, None].exp() * S + v[..., :, None] * k[..., None, :]
    return (S @ q[..., :, None])[..., 0], S


@without_autocast
def recurrent_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                               seg: Tensor | None = None) -> Tensor:
    """S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t, token by token.

    q, k: (B, H, T, dk), v: (B, H, T, dv), g = log α, beta: (B, H, T); seg: (B, T) or None
    -> o (B, H, T, dv), in q's dtype promoted to at least float32."""
    return _recurrent(gated_delta_step, q, k, v, g, beta, seg)


@without_autocast
def recurrent_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, seg: Tensor | None = None) -> Tensor:
    """S_t = α_t S_{t-1} + v_t k_tᵀ, o_t = S_t q_t, token by token (shapes as the delta rule's)."""
    return _recurrent(lambda S, q, k, v, g, beta: gla_step(S, q, k, v, g), q, k, v, g, torch.zeros_like(g), seg)


def _recurrent(step, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, seg: Tensor | None) -> Tensor:
    """o_t of step(S, q_t, k_t, v_t, g_t, β_t) -> (o_t, S_t) from S = 0, the state emptied at every
    document's start, in q's dtype promoted to at least float32: (B, H, T, dv)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    B, H, T, _ = q.shape
    starts = _starts(seg, B, T, q.device)[:, None, None, None]  # (B, 1, 1, 1, T)
    S = q.new_zeros(B, H, v.shape[-1], k.shape[-1])
    out = []
    for t in range(T):
        S = S.masked_fill(starts[..., t], 0.0)  # a new document starts from an empty state
        o, S = step(S, q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
        out.append(o)
    return torch.stack(out, dim=-2)


def _pad(x: Tensor, pad: int, dim: int) -> Tensor:
    """x with ``pad`` zeros appended along dim (-1 or -2); x itself when pad is 0 (no copy)."""
    return x if pad == 0 else F.pad(x, (0, pad) if dim == -1 else (0, 0, 0, pad))


def _chunks(x: Tensor, C: int) -> Tensor:
    """(B, H, T, ...) with T a multiple of C -> (B, H, T/C, C, ...)."""
    return x.unflatten(2, (x.shape[2] // C, C))


def chunked_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                             seg: Tensor | None = None, chunk: int = CHUNK, final: bool = False
                             ) -> Tensor | tuple[Tensor, Tensor]:
    """The gated delta rule in chunks (module doc); the arguments as ``recurrent_gated_delta_rule``.
    final: also the state after the last token, (B, H, dv, dk), where decoding continues."""
    return _chunked(q, k, v, g, beta, seg, chunk, final)


def chunked_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, seg: Tensor | None = None,
                chunk: int = CHUNK, final: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Scalar-decay gated linear attention in chunks (module doc); final as the delta rule's."""
    return _chunked(q, k, v, g, None, seg, chunk, final)


@without_autocast
def _chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, seg: Tensor | None,
             chunk: int, final: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Both rules in chunks: beta None is GLA (u = v), else the delta rule's solve for u."""
    dtype, out_dtype = torch.promote_types(q.dtype, torch.float32), v.dtype  # computed in >= float32
    B, H, T, dk = q.shape
    C = min(chunk, T)
    pad = (-T) % C  # padded tokens come after every real one, so causality keeps them out
    q, k, v, g = (_pad(t.to(dtype), pad, dim) for t, dim in ((q, -2), (k, -2), (v, -2), (g, -1)))
    starts = _pad(_starts(seg, B, T, q.device), pad, -1)  # (B, T')
    seg_id = cumsum(starts, -1)  # (B, T'): segment index, padding joins the last segment
    q, k, v = _chunks(q, C), _chunks(k, C), _chunks(v, C)  # (B, H, N, C, d)
    b = cumsum(_chunks(g, C), -1)  # (B, H, N, C): within-chunk cumulative log decay
    s = _chunks(seg_id[:, None], C)  # (B, 1, N, C)
    same = (s[..., :, None] == s[..., None, :]) & torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    D = (b[..., :, None] - b[..., None, :]).masked_fill(~same, float("-inf")).exp()  # (B, H, N, C, C)
    # tokens whose segment began before the chunk: they read (and carry) the incoming state
    carry = (s == _chunks(F.pad(seg_id, (1, 0), value=-1)[:, None, :-1], C)[..., :1]).to(dtype)  # (B, 1, N, C)
    eb = b.exp() * carry  # (B, H, N, C): e^{b_t}, zero after a reset inside the chunk
    dv = v.shape[-1]
    if beta is None:
        UW = v  # (B, H, N, C, dv): u = v
    else:
        beta = _chunks(_pad(beta.to(dtype), pad, -1), C)[..., None]  # (B, H, N, C, 1)
        # A_tj = β_t D_tj k_t·k_j; the solve reads only j < t (unitriangular: the diagonal is taken
        # as 1 and the upper part ignored), so I + A needs no tril and no identity added
        A = (beta * k) @ k.transpose(-1, -2) * D  # (B, H, N, C, C)
        rhs = torch.cat((beta * v, beta * eb[..., None] * k), dim=-1)  # (B, H, N, C, dv + dk)
        UW = unit_lower_solve(A, rhs)  # [U0 | W]: u_t = U0_t - S_0 W_t
    P = q @ k.transpose(-1, -2) * D  # (B, H, N, C, C): D_tj q_t·k_j
    PUW = P @ UW  # one product for P U0 and P W
    if beta is None:
        o_local, q_state, U0, W = PUW, q * eb[..., None], v, None  # (B, H, N, C, dv)
    else:
        (o_local, PW), (U0, W) = PUW.split((dv, dk), dim=-1), UW.split((dv, dk), dim=-1)
        q_state = q * eb[..., None] - PW  # what of S_0ᵀ each output reads
    last = b[..., -1:]  # (B, H, N, 1)
    k_end = k * ((last - b).exp() * (s == s[..., -1:]))[..., None]  # D_Cj k_j: (B, H, N, C, dk)
    decay_end = (last.exp() * carry[..., -1:])[..., None]  # e^{b_C}, zero if the chunk reset: (B, H, N, 1, 1)
    # the state from chunk to chunk, with a hand-written backward (posenc/nn/chunkwise.py); Sᵀ
    # (dk x dv) as fla keeps it
    flat = [t.flatten(0, 1) if t is not None else None for t in (q_state, U0, W, k_end, decay_end)]  # (B·H, N, ...)
    o = o_local + state_pass(*flat).unflatten(0, (B, H))  # (B, H, N, C, dv)
    o = o.flatten(2, 3)[:, :, :T].to(out_dtype)  # (B, H, T, dv)
    if not final:
        return o
    # padded tokens (k = v = 0, g = 0, β = 0) leave the state as the last token left it
    return o, final_state(*flat[1:]).unflatten(0, (B, H)).transpose(-1, -2)
