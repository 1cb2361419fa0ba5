"""Learned absolute positions (GPT-2, BERT): a max_len x d table added to token embeddings."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import LayerCache
from posenc.nn.mask import Window


class Learned(PositionalEncoding):
    """x + W_pos[pos]. Positions >= max_len have no row: they are refused, never clamped."""

    def __init__(self, d_model: int, n_head: int, max_len: int | None = None, name: str = "learned",
                 train_len: int | None = None) -> None:
        """max_len: the table's rows; None: the training length ``train_len`` (the builder's)."""
        super().__init__(d_model, n_head, name)
        max_len = train_len if max_len is None else max_len
        if max_len is None:
            raise ValueError("learned needs encoding.max_len (null: the training length, which was not given)")
        if max_len <= 0:
            raise ValueError(f"learned needs max_len > 0, got {max_len}")
        self.max_len = int(max_len)
        self.weight = nn.Parameter(torch.empty(self.max_len, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)  # GPT-2's wpe init

    def embed(self, x: Tensor, ctx: Context) -> Tensor:
        # prepare() has refused lengths beyond max_len, so this index is always in range
        table = self.weight[: ctx.T] if ctx.default_positions else self.weight[ctx.pos]  # (T, d_model)
        return x + table.to(x.dtype)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The base class's keys at their positions: a new token's embedding is its own row W_pos[n]
        (decoding stops at max_len: ``prepare`` refuses position max_len as the forward does)."""
        return super().kv_cache(layer, window)

    def options(self) -> dict[str, object]:
        return {"max_len": self.max_len}
