"""RoPE context extension: run (or fine-tune) a model trained at length T on sequences s times
longer by changing its frequencies θ_i = base^(-2i/d). One small function per method, the
same ones Hugging Face transformers ships; each is applied identically when fine-tuning and
when evaluating (it is part of the encoding, not of the evaluator).

With s = 1 every method is the identity. ``d`` is the number of rotated dims (rot_dim).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
#: methods whose frequencies depend on the length L being run, not only on T and s
LENGTH_DEPENDENT = ("dynamic", "longrope")
#: methods that need the training length T
NEED_TRAINING_LENGTH = ("dynamic", "yarn", "llama3", "longrope")


def rope_inv_freq(base: float, d: int) -> Tensor:
    """θ_i = base^(-2i/d), i = 0 .. d/2 - 1 (RoFormer eq. 15): (d/2,) float32."""
    return base ** -(torch.arange(0, d, 2, dtype=torch.float32) / d)


def linear_inv_freq(base: float, d: int, s: float) -> Tensor:
    """Position interpolation (Chen et al., 2023, "Extending Context Window of Large Language
    Models via Positional Interpolation"): positions m -> m/s, i.e. θ_i -> θ_i / s."""
    return rope_inv_freq(base, d) / s


def ntk_base(base: float, d: int, s: float) -> float:
    """NTK-aware base (bloc97, 2023): base · s^(d/(d-2)), which leaves the fastest frequency
    alone and interpolates the slowest by exactly s."""
    return base * s ** (d / (d - 2)) if d > 2 else base * s


def ntk_inv_freq(base: float, d: int, s: float) -> Tensor:
    """θ_i of the NTK-aware base."""
    return rope_inv_freq(ntk_base(base, d, s), d)


def dynamic_inv_freq(base: float, d: int, s: float, T: int, L: int) -> Tensor:
    """Dynamic NTK (emozilla, 2023; Hugging Face's ``dynamic``): the base recomputed from the
    length L being run, base · (s·L/T − (s − 1))^(d/(d−2)) for L > T; plain RoPE for L <= T."""
    if L <= T:
        return rope_inv_freq(base, d)
    return rope_inv_freq(base * (s * L / T - (s - 1)) ** (d / (d - 2)), d)


def yarn_ramp(inv_freq: Tensor, T: int, alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    """γ_i in [0, 1]: 0 (interpolate) for r_i < α, 1 (keep) for r_i > β, linear between;
    r_i = T / λ_i = T·θ_i / 2π is the number of turns dimension i makes over length T."""
    turns = T * inv_freq / (2 * math.pi)
    return ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)


def yarn_inv_freq(base: float, d: int, s: float, T: int) -> Tensor:
    """YaRN (Peng et al., 2023, §3.2-3.4) "NTK-by-parts": per dimension, interpolate (θ_i/s)
    the slow ones, keep the fast ones, a linear ramp between (α = 1, β = 32 turns)."""
    inv_freq = rope_inv_freq(base, d)
    gamma = yarn_ramp(inv_freq, T)
    return (1 - gamma) * inv_freq / s + gamma * inv_freq


def llama3_inv_freq(base: float, d: int, s: float, T: int, low_freq_factor: float = 1.0,
                    high_freq_factor: float = 4.0) -> Tensor:
    """Llama 3.1 (Meta, 2024; Hugging Face's ``llama3``): wavelengths λ_i = 2π/θ_i longer than
    T/low_freq_factor are divided by s, those shorter than T/high_freq_factor are kept, and
    those between are blended linearly in T/λ_i."""
    inv_freq = rope_inv_freq(base, d)
    wavelength = 2 * math.pi / inv_freq
    smooth = ((T / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0.0, 1.0)
    blended = (1 - smooth) * inv_freq / s + smooth * inv_freq
    out = torch.where(wavelength > T / low_freq_factor, inv_freq / s, blended)
    return torch.where(wavelength < T / high_freq_factor, inv_freq, out)


def longrope_inv_freq(base: float, d: int, T: int, L: int, short_factor: Sequence[float],
                      long_factor: Sequence[float]) -> Tensor:
    """LongRoPE (Ding et al., 2024; Phi-3, Hugging Face's ``longrope``): per-frequency rescale
    factors λ_i given in the config, θ_i -> θ_i / λ_i, the long list for L > T, the short one
    otherwise. (The paper's evolutionary search for the factors is out of scope.)"""
    factors = torch.tensor(list(long_factor if L > T else short_factor), dtype=torch.float32)
    if factors.shape[0] != d // 2:
        raise ValueError(f"encoding.short_factor/long_factor need one factor per rotated pair: {d // 2} "
                         f"(rot_dim/2), got {factors.shape[0]}")
    return rope_inv_freq(base, d) / factors


def attention_scale(scaling: str, s: float, T: int | None) -> float:
    """The factor q and k are each multiplied by (folded into cos/sin): YaRN's sqrt(1/t) =
    0.1·ln(s) + 1; LongRoPE's sqrt(1 + ln s / ln T); 1 for the others."""
    if scaling == "yarn":
        return 0.1 * math.log(s) + 1.0
    if scaling == "longrope" and s > 1:
        return math.sqrt(1 + math.log(s) / math.log(T))
    return 1.0


def scaled_inv_freq(scaling: str, base: float, d: int, s: float, T: int | None, L: int,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                    short_factor: Sequence[float] | None = None,
                    long_factor: Sequence[float] | None = None) -> Tensor:
    """θ'_i for the method, at training length T, running length L: (d/2,) float32."""
    if scaling == "none":
        return rope_inv_freq(base, d)
    if scaling == "linear":
        return linear_inv_freq(base, d, s)
    if scaling == "ntk":
        return ntk_inv_freq(base, d, s)
    if scaling == "dynamic":
        return dynamic_inv_freq(base, d, s, int(T), L)
    if scaling == "yarn":
        return yarn_inv_freq(base, d, s, int(T))
    if scaling == "llama3":
        return llama3_inv_freq(base, d, s, int(T), low_freq_factor, high_freq_factor)
    if scaling == "longrope":
        return longrope_inv_freq(base, d, int(T), L, short_factor or [1.0] * (d // 2),
                                 long_factor or [s] * (d // 2))
    raise ValueError(f"encoding.scaling must be one of {', '.join(SCALINGS)}, got '{scaling}'")


def check_scaling(scaling: str, factor: float, original_max_len: int | None, low_freq_factor: float = 1.0,
                  high_freq_factor: float = 4.0) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"encoding.scaling must be one of {', '.join(SCALINGS)}, got '{scaling}'")
    if factor < 1.0:
        raise ValueError(f"encoding.scaling_factor must be >= 1 (how many times longer than training), got {factor}")
    if scaling in NEED_TRAINING_LENGTH and not original_max_len:
        raise ValueError(f"encoding.scaling={scaling} needs encoding.original_max_len (the training length)")
    if scaling == "llama3" and not 0 < low_freq_factor < high_freq_factor:
        raise ValueError(f"encoding.scaling=llama3 needs 0 < low_freq_factor < high_freq_factor, got "
                         f"{low_freq_factor} and {high_freq_factor}")
