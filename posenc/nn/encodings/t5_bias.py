"""T5 relative position bias (Raffel et al., 2020, §2.1; Mesh TensorFlow's implementation).

The relative distance n = i - j between query i and key j is mapped to one of
``num_buckets`` buckets: exact for n < num_buckets/2, logarithmic up to ``max_distance``,
and the last bucket beyond. Each bucket has one learned scalar per head, added to the
attention logits. The table is shared by all layers (T5 computes it once per stack).

How its parameters are scaled, and which of them training can reach (so that T5 learns within the
budgets the encodings are compared at):

- b_h(n) = scale · W[bucket(n), h], W initialised at zero (the model starts as NoPE). Adam
  moves each entry of W by about lr per step whatever its gradient's size, so unscaled
  (T5's own form) the table stays within ~lr · steps of zero in posenc's budgets and T5 is
  ranked near NoPE by construction. ``scale`` (default √head_dim, as x-transformers' T5
  bias) multiplies the bias's step by that factor: for Adam a scale is the table's own
  learning rate, kept inside the encoding so the optimizer needs no special group.
- Only buckets of distances shorter than the training length T receive a gradient. Every
  distance >= max_distance reads the bucket of max_distance - 1 (T5's "last bucket
  beyond"), and the config's default max_distance is T/2: evaluation beyond T reuses a
  bucket trained on every distance T/2..T-1 (about a quarter of the causal pairs), never an
  untrained one. At max_distance = T that bucket would hold distance T-1 alone, seen by one
  pair per window: it learns far less than its neighbours (measured at T = 64: -1.0..-1.2
  where they reach -1.5..-1.8), and the 16x perplexity was 9.6 against 7.8 at T/2 (the same
  perplexity at T). A max_distance above T warns once,
  naming the buckets that stay at their initial zero and what to set instead.
"""

from __future__ import annotations

import math
import warnings

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
    """b_h(i, j) = scale · W[bucket(j - i), h], added to the scores of head h.

    Args:
        num_buckets: buckets per direction (T5: 32).
        max_distance: distances >= max_distance share the bucket of max_distance - 1 (T5: 128);
            None means train_len // 2, so that the shared bucket is trained on many pairs.
        bidirectional: a separate half of the buckets for the future (an encoder; a causal
            decoder masks the future anyway).
        scale: the bias is scale · W; None means √head_dim (x-transformers), 1.0 is T5's form.
        train_len: the training length, if known: a max_distance beyond it warns.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "t5_bias",
        num_buckets: int = 32,
        max_distance: int | None = 128,
        bidirectional: bool = False,
        scale: float | None = None,
        train_len: int | None = None,
    ) -> None:
        super().__init__(d_model, n_head, name)
        if max_distance is None:
            if train_len is None:
                raise ValueError("T5 bias: max_distance=null means half the training length, but no train_len "
                                 "was given — set encoding.max_distance")
            max_distance = max(1, int(train_len) // 2)
        if num_buckets < 2 or max_distance < 1:
            raise ValueError(f"T5 bias needs num_buckets >= 2 and max_distance >= 1, got "
                             f"num_buckets={num_buckets}, max_distance={max_distance}")
        if scale is not None and not scale > 0:
            raise ValueError(f"T5 bias needs scale > 0 (or null for √head_dim), got scale={scale}")
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.bidirectional = bool(bidirectional)
        self.relative_attention_bias = nn.Embedding(self.num_buckets, n_head)
        nn.init.zeros_(self.relative_attention_bias.weight)  # starts as NoPE, learns from there
        # saved with the weights: b = scale · W is the learned function, so a checkpoint keeps
        # the scale it was trained with (see _load_from_state_dict for checkpoints without one)
        self.register_buffer("scale", torch.tensor(math.sqrt(self.head_dim) if scale is None else float(scale)))
        if train_len is not None and self.max_distance > train_len:
            warnings.warn(self.untrained_buckets_message(int(train_len)), RuntimeWarning, stacklevel=2)

    def bucket(self, relative_position: Tensor) -> Tensor:
        """Bucket of relative_position = key - query (any shape, long): T5's bucketing of the
        distance clamped to max_distance - 1, so distances >= max_distance read the bucket of
        max_distance - 1 (T5's last bucket whenever its log buckets reach it there). Below
        max_distance this is Hugging Face's ``T5Attention._relative_position_bucket``; beyond it,
        it differs from Hugging Face's last bucket only where the log buckets do not reach the
        last one at max_distance - 1 (32 buckets: max_distance <= 28, e.g. the default T/2 at
        seq_len 34-57), where that last bucket is one no training distance reaches."""
        reach = self.max_distance - 1
        max_exact = self.num_buckets // (1 + self.bidirectional) // 2
        # T5's formula needs max_distance > max_exact; below that every reachable distance is exact
        log_end = max(self.max_distance, max_exact + 1)
        return relative_position_bucket(relative_position.clamp(-reach, reach), self.bidirectional,
                                        self.num_buckets, log_end)

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(..., Tq), (..., Tk) -> (..., Tq, Tk) bucket ids."""
        return self.bucket(k_pos[..., None, :] - q_pos[..., :, None])

    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if self.bidirectional:
            values = self.relative_attention_bias(self.buckets(q_pos, k_pos))  # (..., Tq, Tk, H)
            return self.scale * values.movedim(-1, -3)  # (..., H, Tq, Tk)
        # causal: every distance >= max_distance - 1 shares one bucket, so a table over
        # n = 0..max_distance - 1 and a gather give the bias without bucketing every (i, j) pair
        table = self.distance_bias(torch.arange(self.max_distance, device=q_pos.device))  # (H, D)
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(0, self.max_distance - 1)  # (..., Tq, Tk)
        return table[:, distance].movedim(0, -3)  # (H, ..., Tq, Tk) -> (..., H, Tq, Tk)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """b_h(n) = scale · W[bucket(-n), h] for distances n = i - j >= 0: (R,) -> (H, R)."""
        return self.scale * self.relative_attention_bias(self.bucket(-distance)).T

    def untrained_buckets_message(self, train_len: int) -> str:
        """What a max_distance beyond the training length leaves untrained, and what to set."""
        n = torch.arange(self.max_distance + 1)
        trained = set(self.bucket(-n[:train_len]).tolist())
        untrained = sorted(set(self.bucket(-n[train_len:]).tolist()) - trained)
        which = f"buckets {untrained[0]}..{untrained[-1]}" if untrained else "no bucket"
        return (f"encoding '{self.name}': max_distance={self.max_distance} exceeds the training length "
                f"{train_len}: {which} (distances {train_len}..{self.max_distance - 1} and beyond) get no "
                f"gradient in training, so evaluation beyond {train_len} tokens adds their untrained initial "
                f"bias — set encoding.max_distance to at most {train_len} (its default, null, is {train_len // 2})")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # a checkpoint written before the scale existed was trained with T5's unscaled bias
        state_dict.setdefault(prefix + "scale", torch.tensor(1.0))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def options(self) -> dict[str, object]:
        return {
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
            "bidirectional": self.bidirectional,
            "scale": round(float(self.scale), 4),
        }
