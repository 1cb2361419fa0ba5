"""Hand-written backward passes for the elementwise steps of the blocks, for eager mode.

On a CPU in eager mode every elementwise op is a pass over memory, and autograd's backward of a
composite op is several more: ``F.rms_norm`` has no fused CPU kernel (it runs as pow, mean,
rsqrt, mul and their backwards, about 3x LayerNorm's fused kernel), SwiGLU's ``chunk`` costs a
``cat`` in the backward and saves SiLU's output besides its input, and the backward of
``view_as_real`` copies the gradient to contiguous memory before RoPE's inverse rotation, which
then needs another copy to the projection's layout; a recurrent layer's short causal convolution,
written as shifted slices, has a zero-filled gradient per slice, and ``F.normalize`` divides
twice backwards. Each function below computes the same maths
as the composite (tests/test_fused.py holds them to it, and to float64 gradients), saves only
what LayerNorm or GELU would save, and writes its gradients in as few passes as it can.

``torch.compile`` (the CUDA default) fuses the composites itself, and on a GPU in eager mode each
composite op is one kernel already: these are used on a CPU in eager mode only. Under autocast
they compute in their inputs' dtype with autocast off (posenc/nn/precision.py): it would lower
their ``vecdot`` and products to bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn.precision import without_autocast


def _hand_written(x: Tensor) -> bool:
    """Where the hand-written backwards run: eager mode on a CPU, where they were measured
    (docs/results.md). Elsewhere torch's composites: compiled, inductor fuses them itself; on a
    GPU in eager mode each op is already one kernel."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


class _RMSNorm(torch.autograd.Function):
    """y = x · r · w, r = (mean(x²) + eps)^(-1/2) per row (Zhang & Sennrich, 2019).

    Backward, with x̂ = x · r and u = Σ_c g·w·x̂ / C per row:
        dx = r · (g·w − x̂ · u),   dw = Σ_rows g · x̂.
    Saves x and r (as LayerNorm saves x and its statistics)."""

    @staticmethod
    @without_autocast
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        r = torch.rsqrt(torch.linalg.vecdot(x, x).unsqueeze(-1) / x.shape[-1] + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, r)
        return torch.mul(x, r).mul_(weight)

    @staticmethod
    @without_autocast
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight, r = ctx.saved_tensors
        gx = (g * x).flatten(0, -2)  # (N, C): both reductions read it, as matrix-vector products
        r_rows = r.flatten()  # (N,)
        dw = r_rows @ gx if ctx.needs_input_grad[1] else None  # Σ_n r_n g_n x_n
        dx = None
        if ctx.needs_input_grad[0]:
            u = (gx @ weight).view_as(r) * r.square() / x.shape[-1]  # r² · Σ_c g·w·x / C per row
            dx = torch.mul(g, weight).addcmul_(x, u, value=-1).mul_(r)  # r · (g·w − x · r · u)
        return dx, dw, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x · (mean(x²) + eps)^(-1/2) · weight over the last dim: the hand-written backward on a CPU
    in float32 (or float64) eager mode; otherwise torch's, normalised in float32 (bf16's mean of squares loses
    digits) and returned in x's dtype before the weight multiplies it."""
    if _hand_written(x) and x.dtype == weight.dtype and x.dtype in (torch.float32, torch.float64):
        return _RMSNorm.apply(x, weight, eps)
    return F.rms_norm(x.float(), x.shape[-1:], None, eps).type_as(x) * weight


class _SwiGLU(torch.autograd.Function):
    """SiLU(a) ⊙ b for h = [a, b] split in halves of the last dim (Shazeer, 2020).

    Saves h alone (SiLU is recomputed), and writes both halves of dh into one tensor, so the
    backward has no ``cat``: dh = [SiLU'(a) · g · b, g · SiLU(a)]."""

    @staticmethod
    def forward(ctx, h: Tensor) -> Tensor:
        a, b = h.chunk(2, dim=-1)
        ctx.save_for_backward(h)
        return F.silu(a).mul_(b)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (h,) = ctx.saved_tensors
        a, b = h.chunk(2, dim=-1)
        dh = torch.empty_like(h)
        da, db = dh.chunk(2, dim=-1)
        torch.mul(g, F.silu(a), out=db)
        torch.ops.aten.silu_backward(g * b, a, grad_input=da)
        return dh


def swiglu(h: Tensor) -> Tensor:
    """SiLU(h[..., :n]) ⊙ h[..., n:], n = h.shape[-1] / 2."""
    if _hand_written(h):
        return _SwiGLU.apply(h)
    a, b = h.chunk(2, dim=-1)
    return F.silu(a) * b


class _ComplexRotation(torch.autograd.Function):
    """Pairs (x_{2i}, x_{2i+1}) as complex numbers times f = r·e^{iφ} (RoPE's rotation, RoFormer
    §3.4.2, r = 1; xPos's rotation and scale, r = ζ^(±n/B)).

    Multiplying by f is the real 2×2 map [[a, −b], [b, a]] per pair (f = a + ib); its transpose,
    the gradient, is multiplying by conj(f) (for RoPE the inverse rotation). It is applied to the
    gradient in whatever layout attention hands back, so no copy is made."""

    @staticmethod
    def forward(ctx, x: Tensor, freqs: Tensor) -> Tensor:
        ctx.save_for_backward(freqs)
        return _rotate(x, freqs)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:
        (freqs,) = ctx.saved_tensors
        return _rotate(g, freqs.conj()), None


def _rotate(x: Tensor, freqs: Tensor) -> Tensor:
    """x (..., 2n) real, freqs (..., n) complex, broadcast -> x rotated, (..., 2n)."""
    if x.stride(-1) != 1 or any(s % 2 for s in x.stride()[:-1]) or x.storage_offset() % 2:
        x = x.contiguous()  # view_as_complex needs (re, im) pairs adjacent in memory
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * freqs).flatten(-2)


def complex_rotation(x: Tensor, freqs: Tensor) -> Tensor:
    """(x_{2i} + i·x_{2i+1}) · freqs_i, back as real pairs: x (..., 2n) float32, freqs (..., n)
    complex64 without a gradient (a fixed rotation, scaled or not)."""
    return _ComplexRotation.apply(x, freqs) if _hand_written(x) and not freqs.requires_grad else _rotate(x, freqs)


class _CausalConvSiLU(torch.autograd.Function):
    """s = SiLU(y), y_t = Σ_{i<K} w_i ⊙ m_i,t x_{t-i}: a depthwise causal convolution (w_0 on the
    current token; m_i,t = 0 where x_{t-i} lies in another document, or before the sequence).

    Backward, with dy = SiLU'(y) ds:  dx_s = Σ_i w_i m_i,s+i dy_{s+i},  dw_i = Σ_{b,t} m_i,t dy_t x_{t-i}.
    Saves x and y (what the composite's SiLU saves, and less than its slices)."""

    @staticmethod
    @without_autocast
    def forward(ctx, x: Tensor, weight: Tensor, keep: Tensor | None) -> Tensor:
        y = _conv(x, weight, keep)
        ctx.save_for_backward(x, weight, keep, y)
        return F.silu(y)

    @staticmethod
    @without_autocast
    def backward(ctx, ds: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, keep, y = ctx.saved_tensors
        T, K = x.shape[1], weight.shape[1]
        dy = torch.ops.aten.silu_backward(ds, y)  # (B, T, C)
        dx = dy * weight[:, 0]
        dw = torch.zeros_like(weight)
        dw[:, 0] = torch.linalg.vecdot(dy.flatten(0, 1).T, x.flatten(0, 1).T)  # Σ_bt dy_t x_t per channel
        for i in range(1, min(K, T)):
            later = dy[:, i:]  # dy_{s+i} for s < T - i
            if keep is not None:
                later = later * keep[:, i, i:, None]  # m_i,s+i
            dx[:, :T - i].addcmul_(later, weight[:, i])
            dw[:, i] = (later * x[:, :T - i]).sum((0, 1))
        return dx, dw, None


def _conv(x: Tensor, weight: Tensor, keep: Tensor | None) -> Tensor:
    """y_t = Σ_i w_i ⊙ m_i,t x_{t-i}: x (B, T, C), weight (C, K), keep (B, K, T) or None. Each tap
    adds into the rows it reaches (t >= i): no padded copy of x."""
    T, K = x.shape[1], weight.shape[1]
    y = x * weight[:, 0]
    for i in range(1, min(K, T)):
        shifted = x[:, :T - i]  # x_{t-i} for t >= i
        if keep is not None:  # a token of an earlier document is not seen
            shifted = shifted * keep[:, i, i:, None]
        y[:, i:].addcmul_(shifted, weight[:, i])
    return y


def causal_conv_silu(x: Tensor, weight: Tensor, seg: Tensor | None) -> Tensor:
    """SiLU of the depthwise causal convolution y_t = Σ_{i<K} w_i ⊙ x_{t-i}, taking no token of
    another document: x (B, T, C), weight (C, K) with w_0 on the current token, seg (B, T)
    segment ids or None. K shifted multiply-adds in x's own (B, T, C) layout: on a CPU,
    conv1d's depthwise backward and the transposes around it cost more than these passes."""
    keep = None
    if seg is not None:  # keep[:, i, t]: x_{t-i} is of t's document (i = 0 always)
        K, T = weight.shape[1], x.shape[1]
        keep = torch.stack([F.pad(seg, (i, 0), value=-1)[:, :T] == seg for i in range(K)], 1).to(x.dtype)
    if _hand_written(x) and x.dtype == weight.dtype:
        return _CausalConvSiLU.apply(x, weight, keep)
    return F.silu(_conv(x, weight, keep))


class _L2Normalize(torch.autograd.Function):
    """y = x · r, r = 1 / max(‖x‖, eps) over the last dim (``F.normalize``).

    Backward: dx = r · (dy - x̂ (x̂ · dy)) with x̂ = x · r (where ‖x‖ > eps; below it r is the
    constant 1/eps and dx = r · dy). Saves x̂ and r."""

    @staticmethod
    @without_autocast
    def forward(ctx, x: Tensor, eps: float) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        r = norm.clamp_min(eps).reciprocal_()
        xh = x * r
        ctx.save_for_backward(xh, r, norm > eps)
        return xh

    @staticmethod
    @without_autocast
    def backward(ctx, dy: Tensor) -> tuple[Tensor, None]:
        xh, r, above = ctx.saved_tensors
        proj = torch.linalg.vecdot(xh, dy).unsqueeze(-1) * above  # x̂ · dy where ‖x‖ > eps
        return dy.addcmul(xh, proj, value=-1).mul_(r), None


def l2_normalize(x: Tensor, eps: float = 1e-12) -> Tensor:
    """x / max(‖x‖, eps) over the last dim, as ``F.normalize`` (and its eps)."""
    if _hand_written(x) and x.dtype in (torch.float32, torch.float64):
        return _L2Normalize.apply(x, eps)
    return F.normalize(x, dim=-1, eps=eps)
