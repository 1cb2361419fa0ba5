"""The explicit-mask plan of a layer kind: SDPA with a boolean mask, or the position bias as a float
mask with -inf on hidden keys (posenc/nn/attention.py chooses it and attends through it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn.mask import AttentionMask


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
              dtype: torch.dtype, max_len: int) -> DensePlan:
        """The plan, its whole mask computed where mask.T <= max_len (attention's DENSE_MAX_LEN)."""
        plan = cls(mask, fn, pos, dtype)
        if mask.T <= max_len:
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
