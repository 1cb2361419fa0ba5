"""The one abstraction: a positional encoding.

Every encoding in the literature acts in one (or more) of three places, so the base
class has three hooks, each a no-op by default:

- ``embed``:  added to the token embeddings before the first block (sinusoidal, learned);
- ``rotate``: a position-dependent transform of queries and keys (RoPE, xPos);
- ``bias``:   a term added to the attention scores (T5 relative bias, ALiBi).

The base class itself is NoPE: no positional information at all, which a causal
decoder can still infer from the mask (Haviv et al., 2022; Kazemnejad et al., 2023).
Attention never asks *which* encoding it has, only whether ``has_bias`` is true.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    """Base class and NoPE. Subclasses override the hooks they need.

    Args:
        d_model: model width (what ``embed`` adds to).
        n_head: number of attention heads (what ``bias`` is per).
        name: the encoding's name in configs, tables and W&B.
    """

    #: longest sequence it can encode (positions 0..max_len-1); None means any length.
    max_len: int | None = None
    #: whether ``bias`` returns a tensor; attention picks its kernel from this alone.
    has_bias: bool = False
    #: whether it only makes sense with a causal mask (xPos's decay, unidirectional buckets).
    causal_only: bool = False
    #: whether ``rotate`` acts on q and k (so it can also act on linear attention's φ(q), φ(k)).
    rotates: bool = False

    def __init__(self, d_model: int, n_head: int, name: str = "nope") -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.name = name

    # --- the three hooks -------------------------------------------------------------
    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """x: (B, T, d_model) token embeddings, pos: (T,) positions -> (B, T, d_model)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, head_dim), pos: (T,) -> q, k with position applied."""
        return q, k

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """q_pos: (Tq,), k_pos: (Tk,) -> (H, Tq, Tk) additive score bias, or None."""
        return None

    # --- what a fast kernel may use instead of ``bias`` ------------------------------
    def relative_bias(self, distance: Tensor) -> Tensor | None:
        """For a bias that depends on positions only through the distance n = i - j of query
        i and key j: distance (R,) long, n >= 0 -> (H, R) table b_h(n), differentiable in the
        encoding's parameters. None (the default) for any other bias, or no bias."""
        return None

    def score_mod(self, pos: Tensor, length: int) -> ScoreMod | None:
        """The bias as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` that computes
        it on the fly, never as an H x T x T tensor; None where the encoding offers none.

        pos: (T,) positions; length: largest position + 1 (what ``prepare`` was given). The
        default derives it from ``relative_bias``; override for a bias of another form."""
        table = self.relative_bias(torch.arange(length, device=pos.device))  # (H, length)
        return None if table is None else relative_score_mod(table, pos)

    def prepare(self, length: int) -> None:
        """Called once per forward, before any hook, with the number of positions needed
        (largest position + 1) as a Python int: refuse what cannot be encoded and grow any
        cache here, so the hooks themselves never synchronise with the device."""
        self.check_length(length)

    # --- helpers shared by every encoding --------------------------------------------
    def check_length(self, length: int) -> None:
        """Refuse a sequence the encoding cannot represent, with a message a user can act on."""
        if self.max_len is not None and length > self.max_len:
            raise PositionOutOfRange(
                f"encoding '{self.name}' can encode positions 0..{self.max_len - 1} "
                f"(max_len={self.max_len}), but a sequence of length {length} was given — "
                f"use a shorter sequence or raise encoding.max_len"
            )

    def options(self) -> dict[str, object]:
        """The encoding's own options, for tables, summaries and `posenc encodings`."""
        return {}

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options().items())
        return f"name={self.name}" + (f", {opts}" if opts else "")


class NoPE(PositionalEncoding):
    """No positional encoding: the causal mask is the only source of order."""


class PositionOutOfRange(ValueError):
    """A position beyond what the encoding can represent (e.g. learned beyond max_len)."""


#: FlexAttention's score_mod signature: (score, batch, head, q_idx, kv_idx) -> score
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def relative_score_mod(table: Tensor, pos: Tensor) -> ScoreMod:
    """score + table[h, pos[i] - pos[j]]: a per-head bias over relative distance, looked up
    per score. table: (H, R), pos: (T,). The future (j > i) is masked by the caller's causal
    BlockMask; its distance is clamped to 0 only so that the lookup stays in range."""

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        n = (pos[q_idx] - pos[kv_idx]).clamp(min=0)
        return score + table[h, n]

    return mod


def positions(length: int, device: torch.device | str | None = None) -> Tensor:
    """The default positions 0..length-1 as a (T,) long tensor."""
    return torch.arange(length, device=device)
