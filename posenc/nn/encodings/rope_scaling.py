"""Eval-time RoPE scaling: run a model trained at length L on sequences s times longer.

- ``linear`` (position interpolation, Chen et al., 2023): positions m -> m/s, i.e. θ_i -> θ_i/s;
- ``ntk`` ("NTK-aware" scaling, bloc97, 2023): a larger base, base -> base · s^(d/(d-2)),
  which leaves the fastest frequency almost alone and interpolates the slowest by s;
- ``yarn`` (Peng et al., 2023, "YaRN", §3.2-3.4): per dimension, by how many full turns
  r_i = L / λ_i (λ_i = 2π/θ_i) it makes over the training length: interpolate (θ_i/s) when
  r_i < α, keep θ_i when r_i > β, a linear ramp in between (α=1, β=32); and scale q and k by
  sqrt(1/t) = 0.1·ln(s) + 1 so the softmax keeps its temperature.

With s = 1 every scaling is the identity.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SCALINGS = ("none", "linear", "ntk", "yarn")


def check_scaling(scaling: str, factor: float, original_max_len: int | None) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"encoding.scaling must be one of {', '.join(SCALINGS)}, got '{scaling}'")
    if factor < 1.0:
        raise ValueError(f"encoding.scaling_factor must be >= 1 (how many times longer than training), got {factor}")
    if scaling == "yarn" and not original_max_len:
        raise ValueError("encoding.scaling=yarn needs encoding.original_max_len (the training length)")


def yarn_ramp(inv_freq: Tensor, original_max_len: int, alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    """γ_i in [0, 1]: 0 (interpolate) for r_i < α, 1 (keep) for r_i > β, linear between;
    r_i = L / λ_i = L·θ_i / 2π is the number of turns dimension i makes over length L."""
    turns = original_max_len * inv_freq / (2 * math.pi)
    return ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)


def scaled_inv_freq(
    base: float, rot_dim: int, scaling: str, factor: float, original_max_len: int | None
) -> Tensor:
    """θ'_i for the given scaling (float32, (rot_dim/2,)); θ_i = base^(-2i/d) when none."""
    exponents = torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim  # 2i/d
    if scaling == "ntk":
        base = base * factor ** (rot_dim / (rot_dim - 2)) if rot_dim > 2 else base * factor
    inv_freq = base**-exponents
    if scaling == "linear":
        return inv_freq / factor
    if scaling == "yarn":
        gamma = yarn_ramp(inv_freq, int(original_max_len))
        return (1 - gamma) * inv_freq / factor + gamma * inv_freq
    return inv_freq


def attention_scale(scaling: str, factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1·ln(s) + 1, applied to both q and k; 1 for the others."""
    return 0.1 * math.log(factor) + 1.0 if scaling == "yarn" else 1.0
