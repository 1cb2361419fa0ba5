"""PoPE, polar coordinate position embeddings (Gopalakrishnan, Csordás, Schmidhuber & Mozer, 2025,
"Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings", arXiv 2509.10534;
x-transformers' ``PolarEmbedding``).

RoPE rotates each pair of q/k dimensions by the position, so a pair's angle mixes the content's
own angle with the position's: content and position are entangled in the score. PoPE gives every
one of the d = head_dim components a magnitude from the content and a phase from the position
alone:

    μ^q_c = softplus(q_c),  μ^k_c = softplus(k_c)                  magnitudes, c = 0..d-1
    φ^q_c = m·θ_c,  φ^k_c = n·θ_c + δ_hc,  θ_c = base^(-c/d)       d frequencies (RoPE has d/2)
    a_mn = Re[q̃_m^H k̃_n] = Σ_c μ^q_c μ^k_c cos((n - m)·θ_c + δ_hc)

with δ a learned per-head, per-frequency phase offset in [-2π, 0] (zero at the start, as
x-transformers and the paper's length-generalisation runs). The score depends on positions only
through n - m. As a ``transform_qk`` hook, q̃ and k̃ are the real 2d-vectors (μ cos φ, μ sin φ), whose
dot product is exactly a_mn; q̃ is multiplied by √2 so that attention's 1/√(2d) scaling of the
2d-wide vectors is the paper's 1/√d. v keeps its width d.

Cost: the score matmul runs over 2d instead of d (twice RoPE's FLOPs there); every kernel takes
q/k and v of different widths (SDPA, FlexAttention).

**Parameters and their scale.** δ (H x head_dim), shared by the layers as x-transformers'
PolarEmbedding shares it, used unscaled: an Adam step moves a phase by about lr radians, 0.8 rad
over 400 steps at lr 2e-3 against its range of 2π; posenc's short runs therefore test PoPE near
its zero-offset start, as the paper's length-generalisation setting starts it.

**δ's range, by wrapping rather than clamping.** The reference code (x-transformers' PolarEmbedding,
PoPE-pytorch) keeps δ in [-2π, 0] by ``clamp(δ, -2π, 0)`` of a parameter that starts at 0, on the
clamp's upper bound. A clamp's gradient there is torch's choice: 1 up to torch 2.14, 0 from 2.15
(0.5 for a tensor bound), so on 2.15 δ never leaves 0. And on any torch the bound is a trap: an
offset pushed above 0 stays clamped, its gradient 0 from then on (23 of 32 offsets of a tiny model
after 50 AdamW steps on 2.13). δ is a phase, 2π-periodic in every score, so posenc maps the parameter
onto the same range by wrapping it, δ = -((-δ_raw) mod 2π) ∈ (-2π, 0]: the same start (0), the same
range and the same scores as the raw value, and the gradient of the raw value everywhere (that of
``remainder`` is 1), so an offset moving past 0 continues from -2π, as its phase does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import LayerCache
from posenc.nn.mask import Window


def pope_frequencies(head_dim: int, base: float) -> Tensor:
    """θ_c = base^(-c/d), c = 0..d-1: (d,) float32."""
    return base ** -(torch.arange(head_dim, dtype=torch.float32) / head_dim)


def polar(x: Tensor, phase: Tensor) -> Tensor:
    """softplus(x) at the given phases as real vectors: x (..., d), phase (..., d) -> (..., 2d)
    = (μ cos φ, μ sin φ)."""
    mu = F.softplus(x)
    return torch.cat((mu * phase.cos(), mu * phase.sin()), dim=-1)


class PoPE(PositionalEncoding):
    """Content magnitudes (softplus), position phases m·θ_c, a learned key phase offset δ."""

    def __init__(self, d_model: int, n_head: int, name: str = "pope", base: float = 10000.0) -> None:
        super().__init__(d_model, n_head, name)
        if not base > 1:
            raise ValueError(f"encoding.base must be > 1, got {base}")
        self.base = float(base)
        self.register_buffer("theta", pope_frequencies(self.head_dim, self.base), persistent=False)
        self.delta = nn.Parameter(torch.zeros(n_head, self.head_dim))  # δ_hc

    def phase_offset(self) -> Tensor:
        """δ wrapped into (-2π, 0]: (H, d), the raw parameter's phase with its gradient (not a clamp,
        whose bound, δ's start, would hold the gradient at 0 on torch >= 2.15: module docstring)."""
        return -torch.remainder(-self.delta, 2 * math.pi)

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, d) -> (B, H, T, 2d) each, computed in (at least) fp32 and cast back."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        angle = ctx.pos.to(dtype)[..., None] * self.theta.to(dtype)  # (T, d) or (B, T, d): m·θ_c
        angle = angle[:, None] if ctx.per_sequence else angle[None, None]  # (B|1, 1, T, d)
        q_out = polar(q.to(dtype), angle) * math.sqrt(2.0)  # √2: attention's 1/√(2d) becomes 1/√d
        k_out = polar(k.to(dtype), angle + self.phase_offset().to(dtype)[None, :, None, :])
        return q_out.to(q.dtype), k_out.to(k.dtype)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The base class's keys at their positions: k̃_n is softplus(k_n) at phases n·θ + δ, from k_n and n alone."""
        return super().kv_cache(layer, window)

    def options(self) -> dict[str, object]:
        return {"base": self.base}
