"""Sinusoidal absolute positions (Vaswani et al., 2017, §3.5), added to token embeddings."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import LayerCache
from posenc.nn.mask import Window


def sinusoidal_table(pos: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """PE[p, 2i] = sin(p / base^(2i/d)),  PE[p, 2i+1] = cos(p / base^(2i/d)).

    pos: (T,) -> (T, d_model), float32.
    """
    i = torch.arange(0, d_model, 2, device=pos.device, dtype=torch.float32)  # (d/2,) holds 2i
    inv_freq = base ** (-i / d_model)  # 1 / base^(2i/d)
    angles = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, d/2)
    pe = torch.empty(pos.shape[0], d_model, device=pos.device, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


class Sinusoidal(PositionalEncoding):
    """x + PE(pos); with ``scale_embeddings`` the token embeddings are first multiplied by
    sqrt(d_model) as in Vaswani et al. §3.4, so that GPT-2's small embedding init is not
    drowned by a unit-amplitude PE."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "sinusoidal",
        base: float = 10000.0,
        scale_embeddings: bool = True,
    ) -> None:
        super().__init__(d_model, n_head, name)
        if d_model % 2 != 0:
            raise ValueError(f"sinusoidal needs an even d_model, got {d_model}")
        self.base = float(base)
        self.scale_embeddings = bool(scale_embeddings)
        # cache grows on demand; not persistent, so checkpoints stay clean
        self.register_buffer("table", torch.empty(0, d_model), persistent=False)

    def prepare(self, length: int) -> None:
        super().prepare(length)
        if self.table.shape[0] < length:
            n = max(length, 2 * self.table.shape[0])
            pos = torch.arange(n, device=self.table.device)
            self.table = sinusoidal_table(pos, self.d_model, self.base)

    def embed(self, x: Tensor, ctx: Context) -> Tensor:
        pe = self.table[: ctx.T] if ctx.default_positions else self.table[ctx.pos]  # (T, d_model); prepare() sized it
        if self.scale_embeddings:
            x = x * math.sqrt(self.d_model)
        return x + pe.to(x.dtype)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The base class's keys at their positions: a new token's embedding adds PE(n), of its position alone."""
        return super().kv_cache(layer, window)

    def options(self) -> dict[str, object]:
        return {"base": self.base, "scale_embeddings": self.scale_embeddings}
