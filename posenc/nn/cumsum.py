"""Cumulative sums as one opaque op, ``posenc::cumsum``, with its own backward.

The model's forward takes cumulative sums in four places: FoX's log forget gates
(posenc/nn/encodings/fox.py), CoPE's contextual positions and stick-breaking's remaining stick
(reversed sums over keys), and the within-chunk log decays of the recurrent layers
(posenc/nn/recurrence.py). ``torch.cumsum`` inside a compiled model is lowered by inductor to a
scan it generates itself, and with torch 2.11 / Triton 3.6 that generated code fails for FoX's
(B, H, T) log gates in a compiled bf16 run on an H200 (``InductorError: TypeError: list indices
must be integers or slices, not NoneType``, in the codegen of a ``SplitScan``).

As a ``torch.library`` custom op the sum is one call the compiler does not look inside: dynamo and
aot_autograd trace ``posenc.cumsum`` as a node, and inductor runs ATen's own cumsum kernel for it.
Its gradient is the reversed cumulative sum, taken through the same op (so the backward graph holds
no scan either):

    y_i = Σ_{t<=i} x_t    =>    ∂L/∂x_t = Σ_{i>=t} ∂L/∂y_i

The dtype is the caller's: the op neither upcasts nor downcasts (under autocast too), so a caller
that sums in float32 (every one above does: a sum over up to T terms) gets float32 back.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("posenc::cumsum", mutates_args=())
def _cumsum(x: Tensor, dim: int, reverse: bool) -> Tensor:
    """y_i = Σ_{t<=i} x_t along dim, or Σ_{t>=i} x_t when reverse (ATen's kernel; a new, contiguous
    tensor, as the op's fake below says)."""
    if reverse:
        return x.flip(dim).cumsum(dim).flip(dim).contiguous()
    return x.cumsum(dim).contiguous()


@_cumsum.register_fake
def _(x: Tensor, dim: int, reverse: bool) -> Tensor:
    # torch.cumsum's dtype rule: floating and complex inputs keep theirs, integers and bools sum in int64
    dtype = x.dtype if x.is_floating_point() or x.is_complex() else torch.int64
    return x.new_empty(x.shape, dtype=dtype)


def _setup_context(ctx, inputs: tuple[Tensor, int, bool], output: Tensor) -> None:
    _, ctx.dim, ctx.reverse = inputs


def _backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
    # ∂L/∂x_t = Σ_{i>=t} ∂L/∂y_i: the sum the other way along the same dim
    return _cumsum(grad, ctx.dim, not ctx.reverse), None, None


_cumsum.register_autograd(_backward, setup_context=_setup_context)


def cumsum(x: Tensor, dim: int = -1, reverse: bool = False) -> Tensor:
    """Σ_{t<=i} x_t along dim (reverse: Σ_{t>=i} x_t, what flip-cumsum-flip computes), as one op
    a compiler keeps whole (module doc). x: any shape -> the same shape; integers and bools sum in
    int64, as torch.cumsum."""
    return _cumsum(x, dim % x.dim() if x.dim() else 0, reverse)
