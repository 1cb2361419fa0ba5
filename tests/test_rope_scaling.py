"""Eval-time RoPE scaling: identity at factor 1, position interpolation, NTK base, YaRN."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.nn.encodings.base import Context
from posenc.nn.encodings.rope import RoPE
from posenc.nn.encodings.rope_scaling import yarn_ramp

D_MODEL, N_HEAD = 64, 2  # head_dim 32


def rope(original_max_len: int = 1024, **kw) -> RoPE:
    return RoPE(D_MODEL, N_HEAD, original_max_len=original_max_len, **kw)


def rotated(enc: RoPE, pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    enc.prepare(int(pos.max()) + 1)
    return enc.rotate(q, k, Context.at(pos))


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_factor_one_is_plain_rope(scaling):
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, N_HEAD, 100, 32).unbind(0)
    pos = torch.arange(100)
    plain = rotated(rope(), pos, q, k)
    scaled = rotated(rope(scaling=scaling, scaling_factor=1.0), pos, q, k)
    torch.testing.assert_close(scaled, plain)


@pytest.mark.parametrize("s", [2, 4, 8])
def test_linear_scaling_at_s_times_p_equals_plain_at_p(s):
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, N_HEAD, 50, 32).unbind(0)
    p = torch.arange(50)
    plain = rotated(rope(), p, q, k)
    interpolated = rotated(rope(scaling="linear", scaling_factor=s), s * p, q, k)
    torch.testing.assert_close(interpolated, plain)


def test_ntk_keeps_the_fastest_frequency_and_interpolates_the_slowest_by_s():
    s = 4.0
    plain, ntk = rope().inv_freq, rope(scaling="ntk", scaling_factor=s).inv_freq
    assert ntk[0].item() == pytest.approx(plain[0].item())  # θ_0 = 1 at any base
    assert ntk[-1].item() == pytest.approx(plain[-1].item() / s, rel=1e-5)  # base·s^(d/(d−2)) at i = d/2−1


def test_yarn_interpolates_long_wavelengths_keeps_short_ones_and_scales_temperature():
    s, L = 4.0, 1024
    plain, yarn = rope().inv_freq, rope(scaling="yarn", scaling_factor=s)
    turns = L * plain / (2 * math.pi)  # r_i: full turns over the training length
    high, low = turns > 32, turns < 1
    assert high.any() and low.any()
    torch.testing.assert_close(yarn.inv_freq[high], plain[high])
    torch.testing.assert_close(yarn.inv_freq[low], plain[low] / s)
    ramp = yarn_ramp(plain, L)
    assert ((ramp >= 0) & (ramp <= 1)).all() and torch.all(ramp[1:] <= ramp[:-1])  # monotone in i
    # q and k each scaled by sqrt(1/t) = 0.1 ln s + 1: a score at distance 0 grows by its square
    q = torch.randn(1, 1, 1, 32)
    yq, yk = rotated(yarn, torch.tensor([3]), q, q)
    pq, pk = rotated(rope(), torch.tensor([3]), q, q)
    ratio = (yq * yk).sum() / (pq * pk).sum()
    assert ratio.item() == pytest.approx((0.1 * math.log(s) + 1) ** 2, rel=1e-5)


def test_unknown_scaling_and_shrinking_factor_are_refused():
    with pytest.raises(ValueError, match="encoding.scaling must be one of"):
        rope(scaling="dynamic")
    with pytest.raises(ValueError, match="scaling_factor must be >= 1"):
        rope(scaling="linear", scaling_factor=0.5)
