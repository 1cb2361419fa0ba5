"""ALiBi: attention with linear biases (Press et al., 2022, "Train Short, Test Long", §3).

No position enters the embeddings or q/k; each head h adds a fixed, non-learned penalty
proportional to the distance between key j and query i:

    score_h(i, j) = q_i·k_j / sqrt(d) + m_h · (j - i),    j <= i

with the geometric slopes m_h = 2^(-8h/H), h = 1..H, for H a power of two. For other H the
paper's reference code takes the slopes of the closest power of two below H and fills the
rest with every other slope of the 2× set (which interleaves between the first ones).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.nn.encodings.base import Context, PositionalEncoding, ScoreMod


def alibi_slopes(n_head: int) -> list[float]:
    """m_h = 2^(-8h/H) for h = 1..H when H is a power of two; the paper's interleaving rule
    otherwise: slopes(2^k) + slopes(2^(k+1))[0::2][: H - 2^k] with 2^k the power below H."""
    if n_head <= 0:
        raise ValueError(f"ALiBi needs n_head > 0, got {n_head}")
    if math.log2(n_head).is_integer():
        return [2.0 ** (-8.0 * h / n_head) for h in range(1, n_head + 1)]
    closest = 2 ** math.floor(math.log2(n_head))
    return alibi_slopes(closest) + alibi_slopes(2 * closest)[0::2][: n_head - closest]


class ALiBi(PositionalEncoding):
    """b_h(i, j) = m_h · (j - i): a linear penalty on distance, fixed per head, any length."""

    def __init__(self, d_model: int, n_head: int, name: str = "alibi") -> None:
        super().__init__(d_model, n_head, name)
        # fixed, not learned, not saved: recomputed from n_head on load
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_head)), persistent=False)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """b_h(n) = -m_h · n for distances n = i - j >= 0: (R,) -> (H, R); the dense bias and, at
        explicit positions, FlexAttention's score_mod are derived from it."""
        return -self.slopes[:, None] * distance.to(torch.float32)[None, :]

    def score_mod(self, ctx: Context) -> ScoreMod:
        """Closed form: score - m_h·(i - j), computed from the indices themselves (no table,
        no gather) when positions are the default 0..T-1."""
        if not ctx.default_positions:
            return super().score_mod(ctx)
        slopes = self.slopes

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score - slopes[h] * (q_idx - kv_idx)

        return mod
