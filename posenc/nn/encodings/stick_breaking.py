"""Stick-breaking attention (Tan, Shen, Yang, Courville & Panda, ICLR 2025, "Scaling
Stick-Breaking Attention: An Efficient Implementation and In-depth Study").

Softmax is replaced by a stick-breaking process over the keys before the query, nearest first:
each key j takes a share β_ij of what the nearer keys left, so order (recency) comes from the
normaliser itself, with no positional encoding:

    β_ij = σ(z_ij),   z_ij = q_i·k_j/√d (+ the inner encoding's bias, if any)
    A_ij = β_ij · Π_{j<k<i} (1 - β_ik)                     keys j < i
    o_i = Σ_{j<i} A_ij v_j + (1 - Σ_{j<i} A_ij) v_i

The stick weights sum to at most 1; what is left of the stick goes to the query's own value, as
the authors' reference computes it (shawntan/stickbreaking-attention: ``o + rem·v``), so the
first token of a sequence attends to itself. In log space, one reversed cumulative sum per row:

    log A_ij = log σ(z_ij) + Σ_{k>j} log σ(-z_ik)          (the sum over stick keys k < i)

A hidden key (another document, outside a window, the future) has z = -inf, hence β = 0: it
takes nothing and leaves the stick whole, so every mask is respected by construction.

This is the contract's ``normalise`` hook: attention writes the logits out (dense on CPU, in
query chunks for long sequences). Where fla's kernels run (CUDA; a CPU under Triton's interpreter),
flash-linear-attention's stick-breaking kernel computes
the whole layer (``fused_attention``, posenc/nn/encodings/fla_kernels.py: its output plus its remainder on
the query's value); without fla, or under a sliding window it does not take, attention falls back to
the explicit path with one warning (FlexAttention computes a softmax). No parameters of its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn.cumsum import cumsum
from posenc.nn import fla_kernels
from posenc.nn.encodings.base import Context, FusedAttention, PositionalEncoding
from posenc.nn.encodings.mechanism import Mechanism


def stick_breaking_weights(scores: Tensor, stick: Tensor) -> Tensor:
    """A_ij = β_ij Π_{k>j, stick} (1 - β_ik), β = σ(scores), over the keys marked ``stick``.

    scores: (..., Tq, Tk), -inf where a key is hidden; stick: (Tq, Tk) bool, the keys that break
    the stick (those before the query) -> (..., Tq, Tk), zero off the stick."""
    log_beta = F.logsigmoid(scores).masked_fill(~stick, float("-inf"))  # log β_ij, -inf off the stick
    log_rest = F.logsigmoid(-scores).masked_fill(~stick, 0.0)  # log(1 - β_ik); a hidden key: log 1 = 0
    # Σ_{k>j} log(1 - β_ik): the reversed cumulative sum, without its own term
    after = cumsum(log_rest, -1, reverse=True) - log_rest
    return (log_beta + after).exp()


class StickBreaking(Mechanism):
    """Stick-breaking weights over the keys before each query, the rest of the stick to itself."""

    def __init__(self, inner: PositionalEncoding, name: str = "stick_breaking") -> None:
        super().__init__(inner, name)
        if inner.offers("normalise") or inner.offers("sink_logit"):
            raise ValueError(f"stick-breaking replaces softmax, which encoding.inner '{inner.name}' "
                             f"{'replaces too' if inner.offers('normalise') else 'adds a sink to'} — "
                             f"wrap an encoding without one (e.g. encoding@encoding.inner=nope)")

    def normalise(self, scores: Tensor, q_idx: Tensor, k_idx: Tensor) -> Tensor:
        """scores (B, H, Tq, Tk) for queries q_idx, keys k_idx -> weights (B, H, Tq, Tk), each row
        summing to 1: the stick over keys before the query, the remainder on the query itself."""
        dtype = torch.promote_types(scores.dtype, torch.float32)  # a cumulative sum over up to T keys
        stick = k_idx[None, :] < q_idx[:, None]  # (Tq, Tk): keys j < i
        weights = stick_breaking_weights(scores.to(dtype), stick)
        rest = (1.0 - weights.sum(-1, keepdim=True)).clamp(min=0.0)  # (B, H, Tq, 1)
        return weights + rest * (k_idx[None, :] == q_idx[:, None])  # the remainder on key i = query i

    def fused_attention(self, ctx: Context, layer: int = 0, log_gates: bool = False) -> FusedAttention | None:
        """Where fla's kernels run, flash-linear-attention's stick-breaking attention around an encoding
        that acts on q and k alone; none under a wrapping FoX (fla's kernel takes no gates)."""
        if log_gates or not self.inner_acts_on_qk():
            return None
        return fla_kernels.stick_breaking_kernel(ctx, layer, self.head_dim, self.name)
