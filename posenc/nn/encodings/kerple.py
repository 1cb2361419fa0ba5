"""KERPLE, logarithmic variant (Chi et al., NeurIPS 2022, "KERPLE: Kernelized Relative
Positional Embedding for Length Extrapolation", §3.3 and eq. (7)).

A conditionally positive definite kernel of the distance, used as a bias on the logits:

    score_h(i, j) = q_i·k_j / sqrt(d) - r1_h · log(1 + r2_h · |i - j|),    r1_h, r2_h > 0

learned per head. It is 0 at distance 0 and decreases monotonically with distance, like
ALiBi's -m_h·|i - j| but logarithmically, with both its strength (r1) and its onset (r2)
learned.

How its parameters are scaled, and which training can reach: r1 and r2 are O(1) numbers
(the paper initialises r1 ~ U(0, 2), r2 ~ U(0, 1), as here), so Adam's ~lr-per-step moves
change them by a large fraction within posenc's budgets: no extra scale is needed. The
paper keeps them positive by clamping them at 0.01 after each step; here r = softplus(ρ)
with ρ the learned parameter (the same initial values, through softplus⁻¹), which keeps
them positive with no in-place projection and a gradient everywhere. The bias is a closed
form of the distance, so every distance, inside or beyond the training length, is computed
from the same two trained numbers per head: nothing is left untrained by extrapolation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.encodings.base import Context, PositionalEncoding, ScoreMod

#: the paper's lower bound on r1, r2 (its clamp), here the floor of the initial values
EPS = 1e-2


def inverse_softplus(y: Tensor) -> Tensor:
    """ρ with softplus(ρ) = y, for y > 0: log(exp(y) - 1), written stably."""
    return y + torch.log(-torch.expm1(-y))


def kerple_log_bias(r1: Tensor, r2: Tensor, distance: Tensor) -> Tensor:
    """-r1 · log(1 + r2 · n) for r1, r2: (H,) and distances n >= 0 of any shape -> (H, *n.shape)."""
    shape = (-1,) + (1,) * distance.dim()
    return -r1.view(shape) * torch.log1p(r2.view(shape) * distance.to(r1.dtype))


class KerpleLog(PositionalEncoding):
    """b_h(i, j) = -r1_h · log(1 + r2_h · |i - j|), r1_h, r2_h > 0 learned per head."""

    def __init__(self, d_model: int, n_head: int, name: str = "kerple") -> None:
        super().__init__(d_model, n_head, name)
        # the paper's initialisation, r1 ~ U(0, 2), r2 ~ U(0, 1), floored at its clamp 0.01
        r1 = (2 * torch.rand(n_head)).clamp(min=EPS)
        r2 = torch.rand(n_head).clamp(min=EPS)
        self.rho1 = nn.Parameter(inverse_softplus(r1))  # (H,)
        self.rho2 = nn.Parameter(inverse_softplus(r2))  # (H,)

    @property
    def r1(self) -> Tensor:
        """(H,) strength of the logarithmic penalty, > 0."""
        return F.softplus(self.rho1)

    @property
    def r2(self) -> Tensor:
        """(H,) scale of the distance inside the log, > 0."""
        return F.softplus(self.rho2)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """b_h(n) = -r1_h · log(1 + r2_h · n) for distances n >= 0: (R,) -> (H, R); the dense bias and,
        at explicit positions, FlexAttention's score_mod are derived from it."""
        return kerple_log_bias(self.r1, self.r2, distance)

    def score_mod(self, ctx: Context) -> ScoreMod:
        """Closed form on q_idx - kv_idx when positions are the default 0..T-1 (no table, no
        gather); the two (H,) parameters are captured, so they receive their gradient."""
        if not ctx.default_positions:
            return super().score_mod(ctx)
        r1, r2 = self.r1, self.r2

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            distance = (q_idx - kv_idx).clamp(min=0).to(r2.dtype)
            return score - r1[h] * torch.log1p(r2[h] * distance)

        return mod
