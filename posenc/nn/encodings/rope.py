"""Rotary position embedding (Su et al., 2021, "RoFormer", §3.2-3.4).

Each pair of query/key dimensions is rotated by an angle proportional to the position:

    R^d_{Θ,m} x = (x_{2i} cos mθ_i - x_{2i+1} sin mθ_i,  x_{2i} sin mθ_i + x_{2i+1} cos mθ_i)_i
    θ_i = base^(-2i/d),  i = 0 .. d/2 - 1

so that <R_m q, R_n k> = <q, R_{n-m} k> depends on positions only through m - n.

``style="interleaved"`` pairs (x[2i], x[2i+1]) as in the paper; ``style="half"`` pairs
(x[i], x[i + d/2]) as GPT-NeoX and LLaMA do (the same maths after a fixed permutation).
``fraction`` < 1 rotates only the first fraction·head_dim dimensions (partial rotary,
GPT-NeoX/GPT-J) and leaves the rest untouched; its frequencies are spread over the rotated dims
(θ_i = base^(-2i/rot_dim)), unlike p-RoPE, which keeps the full spectrum and drops the lowest.
``scaling`` (none | linear | ntk | dynamic | yarn | llama3 | longrope) with ``scaling_factor``
changes the frequencies to run past the training length ``original_max_len`` (rope_scaling.py),
in training (a fine-tune at the longer length) and evaluation alike; every method but ``ntk``
gives Hugging Face transformers' inv_freq and attention factor for the same settings, and
``style="half"`` rotates as its ``apply_rotary_pos_emb`` does (tests/test_rope_parity.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import LayerCache
from posenc.nn.encodings.rope_scaling import (
    LENGTH_DEPENDENT,
    attention_scale,
    scaled_inv_freq,
    scaling_options,
)
from posenc.nn.fused import complex_rotation
from posenc.nn.mask import Window

STYLES = ("interleaved", "half")


def rotated_dims(fraction: float, head_dim: int) -> int:
    """How many of head_dim's dimensions a fraction rotates: whole pairs, at least one."""
    if fraction == 1.0 and head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of dimensions, but head_dim = d_model/n_head = {head_dim} is odd — "
            f"choose model.d_model and model.n_head so that d_model/n_head is even"
        )
    rot_dim = int(fraction * head_dim) // 2 * 2  # rotate whole pairs only
    if rot_dim == 0:
        raise ValueError(
            f"encoding.fraction={fraction} of head_dim={head_dim} rotates no pair of "
            f"dimensions; use a larger fraction"
        )
    return rot_dim


def rotated_part(x: Tensor, rot_dim: int) -> Tensor:
    """x[..., :rot_dim], without recording a no-op slice when that is all of x (its backward
    would allocate a zeros tensor and copy the gradient into it, for every q and k)."""
    return x if rot_dim == x.shape[-1] else x[..., :rot_dim]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, style: str) -> Tensor:
    """Rotate the first 2·cos.shape[-1] dims of x by the angles whose cos/sin are given.

    x: (..., T, head_dim); cos, sin: (T, rot_dim/2), or (B, 1, T, rot_dim/2) for per-sequence
    positions, float32 (float64 in a float64 model) -> same shape and dtype as x.
    Computed in float32 at least and cast back (torchtitan), since bf16 angles lose position; a
    float64 x is rotated in float64 (``posenc check``'s reference).
    """
    rot_dim = 2 * cos.shape[-1]
    xr, x_pass = at_least_float32(rotated_part(x, rot_dim)), x[..., rot_dim:]
    if style == "interleaved":
        x1, x2 = xr[..., 0::2], xr[..., 1::2]  # (..., T, rot/2) each
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:  # half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) = x·cos + flip(x)·(-sin, sin)
        x2d = xr.unflatten(-1, (2, -1))  # (..., T, 2, rot/2): the halves x1, x2
        out = torch.addcmul(x2d * cos.unsqueeze(-2), x2d.flip(-2), torch.stack((-sin, sin), dim=-2)).flatten(-2)
    return torch.cat((out.type_as(x), x_pass), dim=-1) if x_pass.shape[-1] else out.type_as(x)


def at_least_float32(x: Tensor) -> Tensor:
    """x in float32, or as it is where it is wider (float64): bf16 and fp16 lose position."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rotate_complex(x: Tensor, freqs: Tensor) -> Tensor:
    """The interleaved rotation as one complex product: (x_{2i} + i·x_{2i+1}) · e^{i·mθ_i}.

    x: (..., T, head_dim); freqs: (T, rot_dim/2) or (B, 1, T, rot_dim/2) complex64 (complex128 in a
    float64 model) -> same shape and dtype as x.
    The same maths as ``apply_rotary(style="interleaved")`` in one elementwise kernel instead
    of six plus a copy: in eager mode (CPU) it makes interleaved RoPE the cheapest style.
    """
    rot_dim = 2 * freqs.shape[-1]
    out = complex_rotation(at_least_float32(rotated_part(x, rot_dim)), freqs)  # its backward copies nothing
    return torch.cat((out.type_as(x), x[..., rot_dim:]), dim=-1) if rot_dim < x.shape[-1] else out.type_as(x)


class RoPE(PositionalEncoding):
    """Rotary embedding of q and k; cos/sin cached as non-persistent buffers grown on demand."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "rope",
        base: float = 10000.0,
        fraction: float = 1.0,
        style: str = "interleaved",
        scaling: str = "none",
        scaling_factor: float = 1.0,
        original_max_len: int | None = None,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        short_factor: list[float] | None = None,
        long_factor: list[float] | None = None,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        truncate: bool = True,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        train_len: int | None = None,
    ) -> None:
        """original_max_len: the length T the scaling extends from; None: the training length
        ``train_len`` (the builder's); ``trainer.init_from`` sets it to the parent's."""
        super().__init__(d_model, n_head, name)
        original_max_len = train_len if original_max_len is None else original_max_len
        if style not in STYLES:
            raise ValueError(f"encoding.style must be one of {', '.join(STYLES)}, got '{style}'")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"encoding.fraction must be in (0, 1], got {fraction}")
        if base <= 1.0:
            raise ValueError(f"encoding.base must be > 1, got {base}")
        rot_dim = rotated_dims(fraction, self.head_dim)
        options = scaling_options(scaling, float(scaling_factor), original_max_len, low_freq_factor, high_freq_factor,
                                  short_factor, long_factor, beta_fast, beta_slow, truncate, mscale, mscale_all_dim)
        self.base = float(base)
        self.fraction = float(fraction)
        self.style = style
        self.rot_dim = rot_dim
        self.scaling = scaling
        self.scaling_factor = float(scaling_factor)
        self.original_max_len = original_max_len
        self.scaling_options = options
        #: YaRN's / LongRoPE's attention factor, folded into cos/sin so q and k are both scaled by it
        self.attention_scale = attention_scale(scaling, self.scaling_factor, original_max_len, options)
        self.register_buffer("inv_freq", self.frequencies(original_max_len or 0), persistent=False)
        #: the running length the cache was built for (dynamic / longrope depend on it)
        self.cached_for = 0
        self.register_buffer("cos_cached", torch.empty(0, rot_dim // 2), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, rot_dim // 2), persistent=False)

    def angles(self, pos: Tensor) -> Tensor:
        """m·θ_i for every position m in pos: (T,) -> (T, rot_dim/2), in inv_freq's dtype: float32 (in a
        bf16 run too: the buffer stays float32 under autocast), float64 in a float64 model."""
        return pos.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]

    def frequencies(self, length: int) -> Tensor:
        """θ'_i of the configured scaling when running ``length`` positions: (rot_dim/2,)."""
        return scaled_inv_freq(self.scaling, self.base, self.rot_dim, self.scaling_factor, self.original_max_len,
                               length, self.scaling_options)

    def prepare(self, length: int) -> None:
        super().prepare(length)
        if self.scaling in LENGTH_DEPENDENT and length != self.cached_for:
            # θ' depends on the length being run: recompute exactly for it (once per new length), in
            # the buffer's dtype (float64 in a float64 model: float32 here would round every angle)
            self.inv_freq = self.frequencies(length).to(self.inv_freq)
            self.cos_cached = self.cos_cached[:0]
            self.cached_for = length
        if self.cos_cached.shape[0] < length:
            n = length if self.scaling in LENGTH_DEPENDENT else max(length, 2 * self.cos_cached.shape[0])
            theta = self.angles(torch.arange(n, device=self.inv_freq.device))
            self.cos_cached = torch.cos(theta) * self.attention_scale
            self.sin_cached = torch.sin(theta) * self.attention_scale

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_and_sin(ctx)  # (T, rot/2) or (B, 1, T, rot/2) each
        if self.style == "interleaved" and not torch.compiler.is_compiling():
            # eager: one complex product; compiled: inductor fuses the real formula below into
            # one kernel but does not generate code for complex ops
            freqs = torch.complex(cos, sin)  # e^{i·mθ_i}
            return rotate_complex(q, freqs), rotate_complex(k, freqs)
        return apply_rotary(q, cos, sin, self.style), apply_rotary(k, cos, sin, self.style)

    def cos_and_sin(self, ctx: Context) -> tuple[Tensor, Tensor]:
        """cos mθ_i and sin mθ_i at the context's positions, float32: (T, rot/2) each, a slice of
        the cache with the default positions; (B, 1, T, rot/2) for per-sequence positions
        (documents packing), broadcast over the heads."""
        if ctx.default_positions:
            return self.cos_cached[: ctx.T], self.sin_cached[: ctx.T]
        cos, sin = self.cos_cached[ctx.pos], self.sin_cached[ctx.pos]
        return (cos[:, None], sin[:, None]) if ctx.per_sequence else (cos, sin)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The base class's keys at their positions: R_m k_m does not depend on the query, so a kept key stays
        valid (while the frequencies stay: ``cache_epoch``)."""
        return super().kv_cache(layer, window)

    def cache_epoch(self, length: int) -> object:
        """The frequencies a sequence of ``length`` runs with, under a scaling that depends on it (dynamic,
        longrope); None otherwise."""
        return tuple(self.frequencies(length).tolist()) if self.scaling in LENGTH_DEPENDENT else None

    def stale_cache(self) -> str | None:
        if self.scaling not in LENGTH_DEPENDENT:
            return None
        when = "at every new length" if self.scaling == "dynamic" else "once"
        return (f"cache stale beyond {self.original_max_len}: scaling={self.scaling} changes every frequency "
                f"{when} past original_max_len, and every layer's past outputs with them; decoding runs the "
                f"sequence again there")

    def rotary_frequencies(self, layer: int = 0) -> Tensor | None:
        """θ'_i of every pair of head_dim (0 past rot_dim): what the rotation uses now."""
        theta = torch.zeros(self.head_dim // 2)
        theta[: self.rot_dim // 2] = self.inv_freq.float().cpu()
        return theta

    def options(self) -> dict[str, object]:
        opts: dict[str, object] = {"base": self.base, "fraction": self.fraction, "style": self.style}
        if self.scaling != "none":
            opts.update(scaling=self.scaling, scaling_factor=self.scaling_factor)
            o = self.scaling_options
            if self.scaling == "llama3":
                opts.update(low_freq_factor=o.low_freq_factor, high_freq_factor=o.high_freq_factor)
            if self.scaling == "yarn" and (o.beta_fast, o.beta_slow, o.truncate) != (32.0, 1.0, True):
                opts.update(beta_fast=o.beta_fast, beta_slow=o.beta_slow, truncate=o.truncate)
        return opts

