"""T5 relative position bias (Raffel et al., 2020, §2.1; Mesh TensorFlow's implementation).

The relative distance n = i - j between query i and key j is mapped to one of
``num_buckets`` buckets: exact for n < num_buckets/2, logarithmic up to ``max_distance``,
and the last bucket beyond. Each bucket has one learned scalar per head, added to the
attention logits. The table is shared by all layers (T5 computes it once per stack).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import PositionalEncoding


def relative_position_bucket(
    relative_position: Tensor,
    bidirectional: bool = False,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucketing of relative_position = key_pos - query_pos (any shape, long)."""
    ret = torch.zeros_like(relative_position)
    n = -relative_position  # distance back in time
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets  # the future gets its own half
        n = n.abs()
    else:
        # causal: the future has no bucket of its own (it is masked anyway), it shares bucket 0
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # log-spaced buckets between max_exact and max_distance; clamp to the last bucket after
    val_if_large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    val_if_large = val_if_large.clamp(max=num_buckets - 1)
    return ret + torch.where(is_small, n, val_if_large)


class T5Bias(PositionalEncoding):
    """b_h(i, j) = W[bucket(j - i), h], added to the scores of head h."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "t5_bias",
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = False,
    ) -> None:
        super().__init__(d_model, n_head, name)
        if num_buckets < 2 or max_distance <= num_buckets // (1 + bidirectional) // 2:
            raise ValueError(
                f"T5 bias needs num_buckets >= 2 and max_distance > num_buckets/2, got "
                f"num_buckets={num_buckets}, max_distance={max_distance}"
            )
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.bidirectional = bool(bidirectional)
        self.relative_attention_bias = nn.Embedding(self.num_buckets, n_head)
        nn.init.zeros_(self.relative_attention_bias.weight)  # starts as NoPE, learns from there

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(Tq,), (Tk,) -> (Tq, Tk) bucket ids."""
        rel = k_pos[None, :] - q_pos[:, None]
        return relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if self.bidirectional:
            values = self.relative_attention_bias(self.buckets(q_pos, k_pos))  # (Tq, Tk, H)
            return values.permute(2, 0, 1)  # (H, Tq, Tk)
        # causal: every distance >= max_distance shares the last bucket, so a table over
        # n = 0..max_distance and a gather give the bias without bucketing every (i, j) pair
        table = self.relative_bias(torch.arange(self.max_distance + 1, device=q_pos.device))  # (H, D+1)
        return table[:, (q_pos[:, None] - k_pos[None, :]).clamp(0, self.max_distance)]  # (H, Tq, Tk)

    def relative_bias(self, distance: Tensor) -> Tensor:
        """b_h(n) = W[bucket(-n), h] for distances n = i - j >= 0: (R,) -> (H, R)."""
        return self.relative_attention_bias(
            relative_position_bucket(-distance, self.bidirectional, self.num_buckets, self.max_distance)
        ).T

    def options(self) -> dict[str, object]:
        return {
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
            "bidirectional": self.bidirectional,
        }
