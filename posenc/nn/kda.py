"""Kimi Delta Attention (KDA; Kimi Linear, Moonshot AI, 2025): the gated delta rule with one decay
per key channel instead of one per head, the token mixer of ``mixer: kda`` (posenc/nn/recurrent.py).

Per head, with the state S (d_v x d_k) as posenc's other recurrences keep it (posenc/nn/recurrence.py),
α_t = exp(g_t) in (0, 1]^{d_k} (g_t <= 0 per channel, the log decay) and β_t in (0, 1):

    S_t = S_{t-1} diag(α_t) (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,     o_t = S_t q_t

which is fla's ``naive_recurrent_kda`` (fla/ops/kda/naive.py: S ← diag(α) S, then the delta rule,
in its d_k x d_v layout). Documents packing resets the state at every document, as fla's
``cu_seqlens``: ``seg`` (B, T) segment ids as the other recurrences take them.

Two forms, equal in exact arithmetic (tests/test_kda.py, and both to fla's naive references):

- ``recurrent_kda``: token by token, the definition;
- ``chunked_kda``: chunks of C tokens, the WY / UT form of the gated delta rule (posenc/nn/
  recurrence.py) with per-channel decays, as fla's ``chunk_kda``. With b_t = Σ_{s<=t} g_s the
  within-chunk cumulative log decay (now a vector) and γ_t = e^{b_t}, the state a chunk's token t
  holds is S_t = S_0 diag(γ_t) + Σ_{j<=t} u_j (k_j ⊙ γ_t/γ_j)ᵀ, so

      o_t = S_0 (γ_t ⊙ q_t) + Σ_{j<=t} M^q_tj u_j,   (I + A) U = diag(β) V - diag(β) (Γ ⊙ K) S_0ᵀ,
      A_tj = β_t M^k_tj (j < t),   S_C = S_0 diag(γ_C) + Σ_j u_j (k_j ⊙ γ_C/γ_j)ᵀ

  with M^x_tj = Σ_d x_td k_jd e^{b_td - b_jd}, the decayed products. The decays now differ per
  channel, so M is no product of a C x C decay matrix with q kᵀ; it is computed without an
  exponential of a positive number (``decayed_products``): exactly (a C x 8 x d_k tensor) inside
  blocks of 8 tokens, and between blocks through the last token r of the block before the row's,
  e^{b_t - b_j} = e^{b_t - b_r} e^{b_r - b_j}, both factors <= 1, as fla's kernels split a chunk
  into sub-chunks, with a hand-written backward. The solve and the chunk-to-chunk state pass are
  the gated delta rule's (posenc/nn/chunkwise.py; the state's decay is a diagonal); the rest runs
  in autograd. Memory is linear in T.

Both compute in at least float32 with autocast off (posenc/nn/precision.py); the chunked form
returns v's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from posenc.nn.chunkwise import final_state, state_pass, unit_lower_solve
from posenc.nn.cumsum import cumsum
from posenc.nn.precision import without_autocast
from posenc.nn.recurrence import _chunks, _pad, _recurrent, _starts

#: tokens per block inside a chunk whose decayed products are computed exactly (fla's kernels
#: take sub-chunks of 16 in chunks of 64), and per chunk: 16, where the gated delta rule takes 32
#: (posenc/nn/recurrence.py): the per-channel products grow with C; the forward and backward took
#: 54 ms at C = 16 against 75 at 32 and 130 at 64 (B=8, H=4, T=256, d_h=32, one CPU thread;
#: blocks of 4 or 16 were slower than 8: docs/hybrids.md, Cost)
SUB = 8
CHUNK = 16


def kda_step(S: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """One token of KDA: S (B, H, dv, dk), q, k, g = log α (B, H, dk), v (B, H, dv), β (B, H) ->
    (o_t = S_t q_t (B, H, dv), S_t = S diag(α_t) + β_t (v_t - S diag(α_t) k_t) k_tᵀ)."""
    S = S * g[..., None, :].exp()  # S diag(α_t): (B, H, dv, dk)
    S = S + beta[..., None, None] * (v[..., :, None] - S @ k[..., :, None]) * k[..., None, :]  # + β (v - S k) kᵀ
    return (S @ q[..., :, None])[..., 0], S


@without_autocast
def recurrent_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, seg: Tensor | None = None) -> Tensor:
    """S_t = S_{t-1} diag(α_t) (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t, token by token.

    q, k, g = log α: (B, H, T, dk), v: (B, H, T, dv), beta: (B, H, T); seg: (B, T) or None
    -> o (B, H, T, dv), in q's dtype promoted to at least float32."""
    return _recurrent(kda_step, q, k, v, g, beta, seg)


def decayed_products(x: Tensor, k: Tensor, b: Tensor, sub: int = SUB) -> Tensor:
    """M_tj = Σ_d x_td k_jd e^{b_td - b_jd} for j <= t in each chunk, zero above the diagonal.

    x (S, ..., C, dk) (S stacked row inputs: q and k), k and b (..., C, dk), C a multiple of
    ``sub`` -> (S, ..., C, C). b is non-increasing along C (cumulative log decays), so every
    exponential formed is of a number <= 0. With a hand-written backward (``_DecayedProducts``)."""
    return _DecayedProducts.apply(x, k, b, sub)


def _between_blocks(x: Tensor, k: Tensor, b: Tensor, sub: int) -> tuple[Tensor, ...]:
    """x, k, b in blocks of ``sub`` tokens, (S, ..., n, sub, dk) and (..., n, sub, dk), and the
    factors between blocks, through r = the last token of the block before the row's:
    e^{b_t - b_r} (..., n-1, sub, dk), e^{b_r - b_j} (..., n-1, C, dk) (1 for j > r, masked),
    x_t e^{b_t - b_r}, k_j e^{b_r - b_j}, and which columns lie before the row's block (n-1, 1, C)."""
    C = b.shape[-2]
    n = C // sub
    xs, ks, bs = (t.unflatten(-2, (n, sub)) for t in (x, k, b))
    ref = bs[..., :-1, -1:, :]  # (..., n-1, 1, dk)
    ex = (bs[..., 1:, :, :] - ref).exp_()
    ek = (ref - b[..., None, :, :]).clamp_max_(0).exp_()
    earlier = torch.arange(C, device=b.device) < torch.arange(1, n, device=b.device)[:, None, None] * sub
    return xs, ks, bs, ex, ek, xs[..., 1:, :, :] * ex, k[..., None, :, :] * ek, earlier


def _kd(ks: Tensor, bs: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """The d-th subdiagonal inside each block: e^{b_t - b_{t-d}} and k_{t-d} e^{b_t - b_{t-d}}, t >= d."""
    sub = bs.shape[-2]
    e = (bs[..., d:, :] - bs[..., :sub - d, :]).exp_()  # (..., n, sub - d, dk)
    return e, e * ks[..., :sub - d, :]


class _DecayedProducts(torch.autograd.Function):
    """M = the blocks' own terms, subdiagonal by subdiagonal (only the j <= t half is formed, and
    no C x sub x d_k tensor is kept), plus earlier ⊙ (x̃ k̃ᵀ) between blocks (``_between_blocks``).

    Backward, with G = dM: on subdiagonal d, with w_t = Σ_s G^s_t,t-d x^s_t and z = w ⊙ k_{t-d}
    e^{b_t - b_{t-d}} (the gradient of the exponent): dx_t += G_t,t-d k_{t-d} e^{..},
    dk_{t-d} += w e^{..}, db_t += z, db_{t-d} -= z; between blocks, the product's gradients, then
    through each exponential factor alike, and b_r's share of both."""

    @staticmethod
    @without_autocast
    def forward(ctx, x: Tensor, k: Tensor, b: Tensor, sub: int) -> Tensor:
        xs, ks, bs, _, _, xr, kr, earlier = _between_blocks(x, k, b, sub)
        n = b.shape[-2] // sub
        M = x.new_zeros(*xs.shape[:-3], n, sub, n, sub)
        inside = M.diagonal(dim1=-4, dim2=-2)  # the blocks on the diagonal: (S, ..., sub, sub, n)
        for d in range(sub):
            inside.diagonal(-d, -3, -2).copy_(torch.linalg.vecdot(xs[..., d:, :], _kd(ks, bs, d)[1]))
        M = M.flatten(-2)  # (S, ..., n, sub, C)
        if n > 1:  # rows of block I >= 1 against the columns before block I
            M[..., 1:, :, :] += (xr @ kr.transpose(-1, -2)) * earlier
        ctx.save_for_backward(x, k, b)
        ctx.sub = sub
        return M.flatten(-3, -2)  # (S, ..., C, C)

    @staticmethod
    @once_differentiable
    @without_autocast
    def backward(ctx, dM: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        x, k, b = ctx.saved_tensors
        sub = ctx.sub
        xs, ks, bs, ex, ek, xr, kr, earlier = _between_blocks(x, k, b, sub)
        n = b.shape[-2] // sub
        G = dM.unflatten(-2, (n, sub))  # (S, ..., n, sub, C)
        Gi = G.unflatten(-1, (n, sub)).diagonal(dim1=-4, dim2=-2)  # (S, ..., sub, sub, n)
        dx, dk, db = torch.zeros_like(xs), torch.zeros_like(ks), torch.zeros_like(bs)
        for d in range(sub):
            e, kd = _kd(ks, bs, d)
            Gd = Gi.diagonal(-d, -3, -2)[..., None]  # (S, ..., n, sub - d, 1)
            dx[..., d:, :].addcmul_(Gd, kd)
            w = (Gd * xs[..., d:, :]).sum(0)  # (..., n, sub - d, dk)
            dk[..., :sub - d, :].addcmul_(w, e)
            z = w.mul_(kd)
            db[..., d:, :] += z
            db[..., :sub - d, :] -= z
        if n > 1:
            Go = G[..., 1:, :, :] * earlier  # (S, ..., n-1, sub, C)
            dxr, dkr = Go @ kr, (Go.transpose(-1, -2) @ xr).sum(0)  # (S, ..., n-1, sub, dk), (..., n-1, C, dk)
            dx[..., 1:, :, :].addcmul_(dxr, ex)
            zx = (dxr * xr).sum(0)  # the gradient of b_t - b_r through e^{b_t - b_r}: (..., n-1, sub, dk)
            zk = dkr * kr  # and of b_r - b_j through e^{b_r - b_j}: (..., n-1, C, dk)
            db[..., 1:, :, :] += zx
            db.flatten(-3, -2).sub_(zk.sum(-3))
            db[..., :-1, -1, :] += zk.sum(-2) - zx.sum(-2)  # b_r's share
            dk.flatten(-3, -2).add_((dkr * ek).sum(-3))
        return dx.flatten(-3, -2), dk.flatten(-3, -2), db.flatten(-3, -2), None


@without_autocast
def chunked_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, seg: Tensor | None = None,
                chunk: int = CHUNK, final: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """KDA in chunks (module doc); the arguments as ``recurrent_kda``; ``chunk`` a multiple of 8.
    final: also the state after the last token, (B, H, dv, dk), where decoding continues."""
    if chunk % SUB:
        raise ValueError(f"KDA's chunk must be a multiple of {SUB}, got {chunk}")
    dtype, out_dtype = torch.promote_types(q.dtype, torch.float32), v.dtype  # computed in >= float32
    B, H, T, _ = q.shape
    C = min(chunk, -(-T // SUB) * SUB)
    pad = (-T) % C  # padded tokens come after every real one, so causality keeps them out
    q, k, v, g = (_pad(t.to(dtype), pad, -2) for t in (q, k, v, g))
    starts = _pad(_starts(seg, B, T, q.device), pad, -1)  # (B, T')
    seg_id = cumsum(starts, -1)  # (B, T'): segment index, padding joins the last segment
    q, k, v = _chunks(q, C), _chunks(k, C), _chunks(v, C)  # (B, H, N, C, d)
    b = cumsum(_chunks(g, C), -2)  # (B, H, N, C, dk): within-chunk cumulative log decay, per channel
    s = _chunks(seg_id[:, None], C)  # (B, 1, N, C)
    same = (s[..., :, None] == s[..., None, :]) & torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # tokens whose segment began before the chunk: they read (and carry) the incoming state
    carry = (s == _chunks(F.pad(seg_id, (1, 0), value=-1)[:, None, :-1], C)[..., :1]).to(dtype)  # (B, 1, N, C)
    eb = b.exp() * carry[..., None]  # (B, H, N, C, dk): γ_t, zero after a reset inside the chunk
    Mq, Mk = (decayed_products(torch.stack((q, k)), k, b) * same).unbind(0)  # (B, H, N, C, C) each
    beta = _chunks(_pad(beta.to(dtype), pad, -1), C)[..., None]  # (B, H, N, C, 1)
    dv = v.shape[-1]
    # A_tj = β_t M^k_tj; the solve reads only j < t (posenc/nn/recurrence.py)
    UW = unit_lower_solve(beta * Mk, torch.cat((beta * v, beta * eb * k), dim=-1))  # [U0 | W]: u = U0 - S_0 W
    (o_local, PW), (U0, W) = (Mq @ UW).split((dv, UW.shape[-1] - dv), dim=-1), UW.split((dv, UW.shape[-1] - dv), dim=-1)
    q_state = q * eb - PW  # what of S_0ᵀ each output reads
    last = b[..., -1:, :]  # (B, H, N, 1, dk)
    k_end = k * ((last - b).exp() * (s == s[..., -1:])[..., None])  # k_j ⊙ γ_C/γ_j: (B, H, N, C, dk)
    decay_end = (last.exp() * carry[..., -1:, None]).transpose(-1, -2)  # γ_C, zero if the chunk reset: (B, H, N, dk, 1)
    flat = [t.flatten(0, 1) for t in (q_state, U0, W, k_end, decay_end)]  # (B·H, N, ...)
    o = o_local + state_pass(*flat).unflatten(0, (B, H))  # (B, H, N, C, dv)
    o = o.flatten(2, 3)[:, :, :T].to(out_dtype)  # (B, H, T, dv)
    if not final:
        return o
    # padded tokens (k = v = 0, g = 0, β = 0) leave the state as the last token left it
    return o, final_state(*flat[1:]).unflatten(0, (B, H)).transpose(-1, -2)
