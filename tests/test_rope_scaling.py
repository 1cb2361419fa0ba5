"""Eval-time RoPE scaling: identity at factor 1, position interpolation, NTK base, YaRN."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.nn.encodings.base import Context
from posenc.nn.encodings.rope import RoPE

D_MODEL, N_HEAD = 64, 2  # head_dim 32


def rope(original_max_len: int = 1024, **kw) -> RoPE:
    return RoPE(D_MODEL, N_HEAD, original_max_len=original_max_len, **kw)


def rotated(enc: RoPE, pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    enc.prepare(int(pos.max()) + 1)
    return enc.transform_qk(q, k, Context.at(pos))


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


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_ramps_linearly_in_the_pair_index_between():
    """YaRN's NTK-by-parts as its authors' code and Hugging Face compute it: pairs turning more than
    β_fast = 32 times over T are kept, pairs turning less than β_slow = 1 time interpolated by s,
    and between them the kept share γ_i is linear in the pair index i (not in the turns r_i)."""
    s, T = 4.0, 1024
    plain, yarn = rope().inv_freq, rope(scaling="yarn", scaling_factor=s)
    turns = T * plain / (2 * math.pi)  # r_i: full turns over the training length
    high, low = turns > 32, turns < 1
    assert high.any() and low.any()
    torch.testing.assert_close(yarn.inv_freq[high], plain[high])
    torch.testing.assert_close(yarn.inv_freq[low], plain[low] / s)
    gamma = (yarn.inv_freq - plain / s) / (plain - plain / s)  # the kept share of each pair
    band = ((gamma > 1e-6) & (gamma < 1 - 1e-6)).nonzero().flatten()
    assert len(band) >= 3 and torch.all(gamma[1:] <= gamma[:-1] + 1e-6)  # monotone in i
    steps = gamma[band[0] - 1: band[-1] + 2].diff()
    torch.testing.assert_close(steps, torch.full_like(steps, steps[0].item()), atol=1e-5, rtol=0)
    assert not torch.allclose(gamma[band], ((turns[band] - 1) / 31).clamp(0, 1), atol=0.05)  # not the turns


def test_yarn_scales_q_and_k_by_its_attention_factor():
    """q and k each scaled by sqrt(1/t) = 0.1 ln s + 1: a score at distance 0 grows by its square."""
    s = 4.0
    q = torch.randn(1, 1, 1, 32)
    yq, yk = rotated(rope(scaling="yarn", scaling_factor=s), torch.tensor([3]), q, q)
    pq, pk = rotated(rope(), torch.tensor([3]), q, q)
    ratio = (yq * yk).sum() / (pq * pk).sum()
    assert ratio.item() == pytest.approx((0.1 * math.log(s) + 1) ** 2, rel=1e-5)


def test_unknown_scaling_and_shrinking_factor_are_refused():
    with pytest.raises(ValueError, match="encoding.scaling must be one of"):
        rope(scaling="rotary")
    with pytest.raises(ValueError, match="scaling_factor must be >= 1"):
        rope(scaling="linear", scaling_factor=0.5)


# --- every method on the small case: d = 8, T = 16, s = 4, base 10000 -----------------
# θ_i = 10000^(-2i/8) = 1, 0.1, 0.01, 0.001; wavelengths 2π/θ_i = 6.28, 62.8, 628, 6283
SMALL = dict(d_model=8, n_head=1, original_max_len=16)
PLAIN = [1.0, 0.1, 0.01, 0.001]


def inv_freq_at(length: int, **kw) -> list[float]:
    enc = RoPE(**SMALL, **kw)
    enc.prepare(length)
    return enc.inv_freq.tolist()


@pytest.mark.parametrize(("scaling", "length", "expected"), [
    ("linear", 16, [0.25, 0.025, 0.0025, 0.00025]),                 # θ/s
    # base·s^(d/(d-2)) = 10000·4^(4/3) = 63496: θ_i = 63496^(-i/4)
    ("ntk", 16, [1.0, 0.06300, 0.003969, 0.00025]),
    ("dynamic", 16, PLAIN),                                          # L <= T: unchanged
    # L = 64: base·(s·L/T − (s − 1))^(d/(d−2)) = 10000·13^(4/3) = 305,660: θ_i = 305660^(-i/4),
    # so the slowest frequency is 0.001/13 (interpolated by s·L/T − (s − 1) = 13)
    ("dynamic", 64, [1.0, 0.04253, 0.001809, 0.00007692]),
    # wavelength 6.28 lies between T/4 = 4 and T/1 = 16: smooth = (16/6.283 − 1)/3 = 0.5155,
    # θ' = (1 − 0.5155)·1/4 + 0.5155·1 = 0.6366; the others are longer than 16: θ/4
    ("llama3", 16, [0.6366, 0.025, 0.0025, 0.00025]),
    # correction dims i = d·ln(T/(2π·r))/(2 ln base): r = 32 turns at i = −1.10 (floor −2, clamped
    # to 0), r = 1 turn at i = 0.41 (ceil 1): θ_0 kept, the other three interpolated by s
    ("yarn", 16, [1.0, 0.025, 0.0025, 0.00025]),
])
def test_each_method_matches_a_hand_computed_inv_freq(scaling, length, expected):
    assert inv_freq_at(length, scaling=scaling, scaling_factor=4.0) == pytest.approx(expected, rel=2e-3)


def test_longrope_uses_the_short_factors_within_T_and_the_long_ones_past_it():
    kw = dict(scaling="longrope", scaling_factor=4.0, short_factor=[1.0, 1.0, 2.0, 2.0], long_factor=[1, 2, 4, 8])
    assert inv_freq_at(16, **kw) == pytest.approx([1.0, 0.1, 0.005, 0.0005])
    assert inv_freq_at(64, **kw) == pytest.approx([1.0, 0.05, 0.0025, 0.000125])
    # attention factor sqrt(1 + ln s / ln T) on q and k: the score at distance 0 grows by its square
    enc = RoPE(**SMALL, **kw)
    assert enc.attention_scale == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))


def test_dynamic_rotates_positions_within_T_as_plain_rope():
    torch.manual_seed(0)
    q, pos = torch.randn(1, 1, 16, 8), torch.arange(16)
    plain, _ = rotated(RoPE(**SMALL), pos, q, q)
    dynamic, _ = rotated(RoPE(**SMALL, scaling="dynamic", scaling_factor=4.0), pos, q, q)
    torch.testing.assert_close(dynamic, plain)


def test_llama3_keeps_the_high_frequencies_exactly():
    """At T = 64 the wavelengths 6.28 (< T/4 = 16) is kept, 62.8 is blended, the rest divided by s."""
    plain = RoPE(d_model=8, n_head=1).inv_freq
    llama3 = RoPE(d_model=8, n_head=1, original_max_len=64, scaling="llama3", scaling_factor=4.0).inv_freq
    assert llama3[0] == plain[0]
    assert plain[1] / 4 < llama3[1] < plain[1]
    torch.testing.assert_close(llama3[2:], plain[2:] / 4)


@pytest.mark.parametrize("scaling", ["linear", "ntk", "dynamic", "yarn", "llama3", "longrope"])
def test_every_method_keeps_ropes_relative_property(scaling):
    """Scores depend on positions only through m − n, at any length (RoFormer §3.4.2)."""
    torch.manual_seed(0)
    enc = RoPE(**SMALL, scaling=scaling, scaling_factor=4.0)
    q, k = torch.randn(2, 1, 1, 1, 8).unbind(0)
    scores = []
    for shift in (0, 9, 40):
        pos = torch.tensor([3 + shift, shift])
        enc.prepare(64)  # one running length for all shifts (dynamic / longrope depend on it)
        rq, rk = enc.transform_qk(torch.cat([q, k], 2), torch.cat([q, k], 2), Context.at(pos))
        scores.append(float((rq[..., 0, :] * rk[..., 1, :]).sum()))
    assert scores == pytest.approx([scores[0]] * 3, rel=1e-4)
