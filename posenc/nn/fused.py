"""Hand-written backward passes for three elementwise steps of the block, for eager mode.

On a CPU in eager mode every elementwise op is a pass over memory, and autograd's backward of a
composite op is several more: ``F.rms_norm`` has no fused CPU kernel (it runs as pow, mean,
rsqrt, mul and their backwards, about 3x LayerNorm's fused kernel), SwiGLU's ``chunk`` costs a
``cat`` in the backward and saves SiLU's output besides its input, and the backward of
``view_as_real`` copies the gradient to contiguous memory before RoPE's inverse rotation, which
then needs another copy to the projection's layout. Each function below computes the same maths
as the composite (tests/test_fused.py holds them to it, and to float64 gradients), saves only
what LayerNorm or GELU would save, and writes its gradients in as few passes as it can.

``torch.compile`` (the CUDA default) fuses the composites itself, and on a GPU in eager mode each
composite op is one kernel already: these are used on a CPU in eager mode only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


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
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        r = torch.rsqrt(torch.linalg.vecdot(x, x).unsqueeze(-1) / x.shape[-1] + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, r)
        return torch.mul(x, r).mul_(weight)

    @staticmethod
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
