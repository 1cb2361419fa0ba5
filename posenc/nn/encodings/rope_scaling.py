"""RoPE context extension: run (or fine-tune) a model trained at length T on sequences s times
longer by changing its frequencies θ_i = base^(-2i/d). One small function per method, the
same ones Hugging Face transformers ships (``ROPE_INIT_FUNCTIONS``: linear, dynamic, yarn, llama3,
longrope give its inv_freq and attention factor for the same base, rot_dim, factor and original
length; tests/test_rope_parity.py checks each against the installed transformers); ``ntk``, the
static NTK-aware base, has no Hugging Face counterpart. Each is applied identically when
fine-tuning and when evaluating (it is part of the encoding, not of the evaluator).

With s = 1 every method is the identity. ``d`` is the number of rotated dims (rot_dim). Hugging
Face's ``max_position_embeddings`` (dynamic) and ``original_max_position_embeddings`` (the others)
are both ``T`` here, the training length ``encoding.original_max_len``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def yarn_correction_dim(turns: float, d: int, base: float, T: int) -> float:
    """The (fractional) pair index i whose frequency θ_i = base^(-2i/d) makes ``turns`` full
    turns over the training length T: T·θ_i / 2π = turns  <=>  i = d·ln(T / (2π·turns)) / (2 ln base)."""
    return d * math.log(T / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_correction_range(d: int, base: float, T: int, beta_fast: float = 32.0, beta_slow: float = 1.0,
                          truncate: bool = True) -> tuple[float, float]:
    """(low, high): the pair indices that turn β_fast and β_slow times over T. Pairs below low
    (faster) are kept, pairs above high (slower) interpolated. ``truncate`` rounds them outwards
    to whole pairs (floor, ceil), as the YaRN authors' code always did and Hugging Face does by
    default; both clamp to [0, d - 1] (d, not d/2: their bound, kept so the slope is theirs)."""
    low = yarn_correction_dim(beta_fast, d, base, T)
    high = yarn_correction_dim(beta_slow, d, base, T)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def yarn_ramp(d: int, low: float, high: float) -> Tensor:
    """γ_i in [0, 1], the weight of the kept frequency: 1 for pairs i <= low, 0 for i >= high,
    linear in the pair index i between (the authors' ``1 - linear_ramp_mask``): (d/2,) float32."""
    if low == high:
        high += 0.001  # one pair wide: a step, not a division by zero (as in the authors' code)
    return 1.0 - ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0.0, 1.0)


def yarn_inv_freq(base: float, d: int, s: float, T: int, beta_fast: float = 32.0, beta_slow: float = 1.0,
                  truncate: bool = True) -> Tensor:
    """YaRN (Peng et al., 2023, §3.2-3.4) "NTK-by-parts": θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i, with
    γ_i the ramp over the pair index between the correction dims of β_fast = 32 and β_slow = 1
    turns over T. The paper's text ramps linearly in the number of turns r_i = T·θ_i/2π instead;
    the endpoints agree, the band between does not, and every released YaRN model (the authors'
    code, Hugging Face's ``yarn``) uses the ramp over the index, so that is what this computes."""
    inv_freq = rope_inv_freq(base, d)
    gamma = yarn_ramp(d, *yarn_correction_range(d, base, T, beta_fast, beta_slow, truncate))
    return (1 - gamma) * inv_freq / s + gamma * inv_freq


def yarn_mscale(s: float, mscale: float = 1.0) -> float:
    """YaRN's sqrt(1/t) = 0.1·mscale·ln s + 1 (1 for s <= 1)."""
    return 1.0 if s <= 1 else 0.1 * mscale * math.log(s) + 1.0


def yarn_attention_factor(s: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """The factor q and k are each multiplied by: 0.1·ln s + 1, or, where both ``mscale`` and
    ``mscale_all_dim`` are given (DeepSeek's configs), the ratio of the two mscales."""
    if mscale and mscale_all_dim:
        return yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)
    return yarn_mscale(s)


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


@dataclass(frozen=True)
class ScalingOptions:
    """The methods' own options, named as Hugging Face's ``rope_parameters`` name them. Defaults
    are the papers' and Hugging Face's, except where Hugging Face has none (docs/usage.md,
    Length extrapolation): llama3's factors (Meta's 1 and 4) and longrope's lists (short: 1, long: s)."""

    low_freq_factor: float = 1.0        # llama3
    high_freq_factor: float = 4.0       # llama3
    short_factor: tuple[float, ...] | None = None   # longrope, used up to T (None: 1 for every pair)
    long_factor: tuple[float, ...] | None = None    # longrope, used past T (None: s for every pair)
    beta_fast: float = 32.0             # yarn: pairs turning more than this over T are kept
    beta_slow: float = 1.0              # yarn: pairs turning less than this over T are interpolated
    truncate: bool = True               # yarn: round the correction range to whole pairs
    mscale: float | None = None         # yarn: attention factor mscale(s, mscale) / mscale(s, mscale_all_dim)
    mscale_all_dim: float | None = None


def attention_scale(scaling: str, s: float, T: int | None, options: ScalingOptions = ScalingOptions()) -> float:
    """The factor q and k are each multiplied by (folded into cos/sin): YaRN's sqrt(1/t) =
    0.1·ln(s) + 1; LongRoPE's sqrt(1 + ln s / ln T); 1 for the others."""
    if scaling == "yarn":
        return yarn_attention_factor(s, options.mscale, options.mscale_all_dim)
    if scaling == "longrope" and s > 1:
        return math.sqrt(1 + math.log(s) / math.log(T))
    return 1.0


def scaled_inv_freq(scaling: str, base: float, d: int, s: float, T: int | None, L: int,
                    options: ScalingOptions = ScalingOptions()) -> Tensor:
    """θ'_i for the method, at training length T, running length L: (d/2,) float32."""
    o = options
    if scaling == "none":
        return rope_inv_freq(base, d)
    if scaling == "linear":
        return linear_inv_freq(base, d, s)
    if scaling == "ntk":
        return ntk_inv_freq(base, d, s)
    if scaling == "dynamic":
        return dynamic_inv_freq(base, d, s, int(T), L)
    if scaling == "yarn":
        return yarn_inv_freq(base, d, s, int(T), o.beta_fast, o.beta_slow, o.truncate)
    if scaling == "llama3":
        return llama3_inv_freq(base, d, s, int(T), o.low_freq_factor, o.high_freq_factor)
    if scaling == "longrope":
        return longrope_inv_freq(base, d, int(T), L, o.short_factor or [1.0] * (d // 2),
                                 o.long_factor or [s] * (d // 2))
    raise ValueError(f"encoding.scaling must be one of {', '.join(SCALINGS)}, got '{scaling}'")


def scaling_options(scaling: str, factor: float, original_max_len: int | None, low_freq_factor: float = 1.0,
                    high_freq_factor: float = 4.0, short_factor: Sequence[float] | None = None,
                    long_factor: Sequence[float] | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
                    truncate: bool = True, mscale: float | None = None, mscale_all_dim: float | None = None
                    ) -> ScalingOptions:
    """The methods' options from the encoding's config values (lists, ints), checked against the
    method, the factor and the training length (``check_scaling``)."""
    options = ScalingOptions(float(low_freq_factor), float(high_freq_factor),
                             tuple(short_factor) if short_factor else None, tuple(long_factor) if long_factor else None,
                             float(beta_fast), float(beta_slow), bool(truncate), mscale, mscale_all_dim)
    check_scaling(scaling, factor, original_max_len, options)
    return options


def check_scaling(scaling: str, factor: float, original_max_len: int | None,
                  options: ScalingOptions = ScalingOptions()) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"encoding.scaling must be one of {', '.join(SCALINGS)}, got '{scaling}'")
    if factor < 1.0:
        raise ValueError(f"encoding.scaling_factor must be >= 1 (how many times longer than training), got {factor}")
    if scaling in NEED_TRAINING_LENGTH and not original_max_len:
        raise ValueError(f"encoding.scaling={scaling} needs encoding.original_max_len (the training length)")
    if scaling == "llama3" and not 0 < options.low_freq_factor < options.high_freq_factor:
        raise ValueError(f"encoding.scaling=llama3 needs 0 < low_freq_factor < high_freq_factor, got "
                         f"{options.low_freq_factor} and {options.high_freq_factor}")
    if scaling == "yarn" and not 0 < options.beta_slow < options.beta_fast:
        raise ValueError(f"encoding.scaling=yarn needs 0 < beta_slow < beta_fast (turns over the training length), "
                         f"got {options.beta_slow} and {options.beta_fast}")
