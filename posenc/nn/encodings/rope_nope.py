"""RoPE/NoPE hybrids with length-dependent attention temperature.

**Interleaved layers.** Most layers rotate q and k with RoPE, every ``nope_every``-th layer has
no positional encoding at all: Llama 4's interleaved layers (Meta, 2025: RoPE on three layers
in four, NoPE on the fourth) and Yang et al. (2025, "Rope to Nope and Back Again: A New Hybrid
Attention Strategy": RNoPE, one NoPE layer after every three RoPE layers). The NoPE layers
attend by content alone, so they carry no position-specific pattern to break beyond the
training length, while the RoPE layers keep local order.

Layers are counted back from the last one: layer l (0-based) is NoPE when
(n_layer - 1 - l) % nope_every == 0. With a multiple of ``nope_every`` layers that is Llama 4's
rule, (l + 1) % 4 != 0 for RoPE; with fewer layers than ``nope_every`` the last layer is still
NoPE, so a 2-layer model is a hybrid, not RoPE. ``nope_layers`` lists them explicitly instead.

**Attention temperature** (``temperature: log``), Llama 4's attention temperature tuning: the
logits of the query at position m are multiplied by

    τ(m) = 1 + β · ln(⌊m / L⌋ + 1),    L = original_max_len (the training length), β = 0.1

so the softmax stays sharp when many more keys compete than in training. Llama 4 writes
⌊(m + 1) / F⌋ with a fixed F = 8192; here F = L and m counts from 0 so that every training
position 0 .. L-1 keeps τ = 1 exactly (with m + 1, position L-1 would already get 1 + β·ln 2):
training is unchanged, and only evaluation beyond L sees τ > 1. As in Llama 4, τ applies to the
NoPE layers (``temperature_layers: nope``); ``all`` applies it to every layer. It is the
contract's ``logit_scale``: attention multiplies q_m by τ(m), which scales that query's logits
q·k/√d (rotations are linear), on every kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.nn.encodings.base import Context
from posenc.nn.encodings.cache import LayerCache
from posenc.nn.encodings.rope import RoPE
from posenc.nn.mask import Window

TEMPERATURES = ("none", "log")
TEMPERATURE_LAYERS = ("nope", "all")


def interleaved_nope_layers(n_layer: int, nope_every: int) -> frozenset[int]:
    """The NoPE layers: every nope_every-th layer counted back from the last (Llama 4's layers
    (l + 1) % 4 == 0 when n_layer is a multiple of 4; the last layer always)."""
    return frozenset(l for l in range(n_layer) if (n_layer - 1 - l) % nope_every == 0)


def log_temperature(pos: Tensor, original_max_len: int, beta: float) -> Tensor:
    """τ(m) = 1 + β·ln(⌊m / L⌋ + 1) at each position m: (...) -> (...) float32; 1 for m < L."""
    return 1.0 + beta * torch.log1p(torch.div(pos, original_max_len, rounding_mode="floor").to(torch.float32))


class RoPENoPE(RoPE):
    """RoPE on most layers, nothing on the NoPE layers, and an optional log attention temperature."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        n_layer: int,
        name: str = "rope_nope",
        nope_every: int = 4,
        nope_layers: list[int] | None = None,
        temperature: str = "none",
        temperature_beta: float = 0.1,
        temperature_layers: str = "nope",
        base: float = 10000.0,
        style: str = "interleaved",
        scaling: str = "none",
        scaling_factor: float = 1.0,
        original_max_len: int | None = None,
        train_len: int | None = None,
    ) -> None:
        super().__init__(d_model, n_head, name, base=base, style=style, scaling=scaling,
                         scaling_factor=scaling_factor, original_max_len=original_max_len, train_len=train_len)
        if n_layer <= 0:
            raise ValueError(f"model.n_layer must be positive, got {n_layer}")
        if nope_layers is None:
            if nope_every < 1:
                raise ValueError(f"encoding.nope_every must be >= 1 (1: every layer is NoPE), got {nope_every}")
            layers = interleaved_nope_layers(n_layer, int(nope_every))
        else:
            layers = frozenset(int(l) for l in nope_layers)
            if any(not 0 <= l < n_layer for l in layers):
                raise ValueError(f"encoding.nope_layers={sorted(layers)} must be layer indices in 0..{n_layer - 1}")
        if temperature not in TEMPERATURES:
            raise ValueError(f"encoding.temperature must be one of {', '.join(TEMPERATURES)}, got '{temperature}'")
        if temperature_layers not in TEMPERATURE_LAYERS:
            raise ValueError(f"encoding.temperature_layers must be one of {', '.join(TEMPERATURE_LAYERS)}, "
                             f"got '{temperature_layers}'")
        if temperature == "log" and not self.original_max_len:
            raise ValueError("encoding.temperature=log needs encoding.original_max_len (the training length)")
        if temperature_beta < 0 or not math.isfinite(temperature_beta):
            raise ValueError(f"encoding.temperature_beta must be >= 0, got {temperature_beta}")
        self.n_layer = n_layer
        self.nope_every = nope_every
        self.nope_layers = layers
        self.temperature = temperature
        self.temperature_beta = float(temperature_beta)
        self.temperature_layers = temperature_layers

    def is_nope(self, layer: int) -> bool:
        return layer in self.nope_layers

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> tuple[Tensor, Tensor]:
        return (q, k) if self.is_nope(layer) else super().transform_qk(q, k, ctx, layer)

    def rotary_frequencies(self, layer: int = 0) -> Tensor | None:
        return None if self.is_nope(layer) else super().rotary_frequencies(layer)

    def logit_scale(self, ctx: Context, layer: int = 0) -> Tensor | None:
        """τ(m) of each query m: (1|B, 1, T, 1), the same for every head; None where it is 1 at
        every position (no temperature, a sequence no longer than L, a layer it does not apply to)."""
        if (self.temperature != "log" or ctx.n_positions <= self.original_max_len
                or not (self.temperature_layers == "all" or self.is_nope(layer))):
            return None
        tau = log_temperature(ctx.pos, self.original_max_len, self.temperature_beta)  # (T,) or (B, T)
        return tau.view(-1 if ctx.per_sequence else 1, 1, ctx.T, 1)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """RoPE's: a NoPE layer's transform is none, a RoPE layer's RoPE's, both position-wise, and τ(m) is
        read from the new query's position."""
        return super().kv_cache(layer, window)

    def options(self) -> dict[str, object]:
        opts: dict[str, object] = {"nope_layers": sorted(self.nope_layers), "base": self.base, "style": self.style,
                                   "temperature": self.temperature}
        if self.temperature != "none":
            opts.update(temperature_beta=self.temperature_beta, temperature_layers=self.temperature_layers)
        if self.scaling != "none":
            opts.update(scaling=self.scaling, scaling_factor=self.scaling_factor)
        return opts
