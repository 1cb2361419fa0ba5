"""xPos (Sun et al., 2022, "A Length-Extrapolatable Transformer", §3.1-3.2).

RoPE whose rotation also scales: pair i of a query at position n is multiplied by
ζ_i^(n/B) and of a key at position m by ζ_i^(-m/B), with

    ζ_i = (2i/d + γ) / (1 + γ),   γ = 0.4,  B = scale_base = 512,

so the score of pair i carries ζ_i^((n-m)/B) < 1: it still depends only on n - m, and it
decays with distance, faster for the high-frequency pairs (small i) that RoPE leaves most
unstable. The decay only makes sense for n >= m, so xPos is causal only. As the reference
code does, positions are centred (shifted by half the length) before exponentiation so that
ζ^(±n/B) never overflows; the shift cancels in n - m.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import KeysAtPositions, LayerCache
from posenc.nn.encodings.rope import RoPE, apply_rotary, rotate_complex
from posenc.nn.mask import Window


def xpos_zeta(rot_dim: int, gamma: float = 0.4) -> Tensor:
    """ζ_i = (2i/d + γ) / (1 + γ) for i = 0 .. d/2-1, float32."""
    return (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim + gamma) / (1 + gamma)


class XPos(RoPE):
    """RoPE with a per-dimension exponential decay in the query-key distance."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "xpos",
        base: float = 10000.0,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        style: str = "interleaved",
    ) -> None:
        super().__init__(d_model, n_head, name, base=base, style=style)
        if scale_base <= 0 or gamma <= 0:
            raise ValueError(f"xpos needs scale_base > 0 and gamma > 0, got {scale_base}, {gamma}")
        self.scale_base = float(scale_base)
        self.gamma = float(gamma)
        self.register_buffer("zeta", xpos_zeta(self.rot_dim, self.gamma), persistent=False)
        self.center = 0

    def prepare(self, length: int) -> None:
        super().prepare(length)
        self.center = length // 2  # keeps ζ^(±pos/B) in float range; cancels in n - m

    def zeta_powers(self, pos: Tensor, center: int | None = None) -> Tensor:
        """ζ_i^((pos - c)/B): (T,) -> (T, rot_dim/2), or (B, T) -> (B, 1, T, rot_dim/2), float32; c the
        centre ``prepare`` set unless given."""
        exponent = (pos.to(torch.float32) - (self.center if center is None else center)) / self.scale_base
        decay = self.zeta ** exponent[..., None]
        return decay[:, None] if pos.dim() == 2 else decay

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> tuple[Tensor, Tensor]:
        return self.about(q, k, ctx, self.center)

    def about(self, q: Tensor, k: Tensor, ctx: Context, center: int) -> tuple[Tensor, Tensor]:
        """transform_qk with the positions centred at ``center`` (what cancels in n - m)."""
        cos, sin = self.cos_and_sin(ctx)  # (T, rot/2) or (B, 1, T, rot/2)
        scale = self.zeta_powers(ctx.pos, center)  # the same shape: queries scaled up by it, keys down
        if self.style == "interleaved" and not torch.compiler.is_compiling():
            # eager: RoPE's one complex product, the scale its modulus: ζ^(n/B)·e^{inθ} for queries
            # (compiled: inductor fuses the real formula below and has no complex ops)
            freqs = torch.complex(cos, sin)
            return rotate_complex(q, freqs * scale), rotate_complex(k, freqs / scale)
        q = apply_rotary(q, cos * scale, sin * scale, self.style)
        k = apply_rotary(k, cos / scale, sin / scale, self.style)
        return q, k

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """Keys rotated and scaled at their positions about the prompt's centre, which the new queries are
        scaled about too: the centre cancels in n - m, and a centre moving with the length (as the full
        forward's does) would leave the kept keys scaled about another one."""
        return Centred(self, layer, window, self)

    def options(self) -> dict[str, object]:
        return {"base": self.base, "scale_base": self.scale_base, "gamma": self.gamma, "style": self.style}


class Centred(KeysAtPositions):
    """xPos's keys at their positions, scaled by ζ^(-(m - c)/B) about the prompt's centre c, and every new
    query scaled about the same c (``XPos.about``): ζ^((n - c)/B)·ζ^(-(m - c)/B) = ζ^((n - m)/B)."""

    keeps = "keys at their positions (scaled about the prompt's centre), values"

    def __init__(self, encoding: PositionalEncoding, layer: int, window: Window, xpos: XPos) -> None:
        super().__init__(encoding, layer, window)
        self.xpos = xpos
        self.center: int | None = None

    def transform(self, q: Tensor, k: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        if self.center is None:  # the prompt's, set by its forward's prepare
            self.center = self.xpos.center
        return self.xpos.about(q, k, ctx, self.center)
