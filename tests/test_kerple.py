"""KERPLE, log variant (Chi et al., 2022, eq. (7)): b_h(i, j) = -r1_h · log(1 + r2_h · |i - j|)."""

from __future__ import annotations

import math

import torch

from posenc.config import compose
from posenc.build import build_encoding
from posenc.nn.encodings.kerple import KerpleLog, inverse_softplus


def kerple(r1: list[float], r2: list[float]) -> KerpleLog:
    enc = KerpleLog(d_model=8 * len(r1), n_head=len(r1))
    with torch.no_grad():
        enc.rho1.copy_(inverse_softplus(torch.tensor(r1)))
        enc.rho2.copy_(inverse_softplus(torch.tensor(r2)))
    return enc


def test_bias_is_minus_r1_log_of_one_plus_r2_distance():
    """Hand-computed: r1 = 2, r2 = 0.5 gives 0, -2·ln 1.5, -2·ln 2, -2·ln 3 at distances 0, 1, 2, 4;
    r1 = 0.5, r2 = 3 gives 0, -0.5·ln 4, -0.5·ln 7, -0.5·ln 13."""
    enc = kerple([2.0, 0.5], [0.5, 3.0])
    pos = torch.arange(5)
    b = enc.position_bias(pos, pos)  # (H, T, T)
    expected = torch.tensor([[0.0, -0.810930, -1.386294, -2.197225], [0.0, -0.693147, -0.972955, -1.282475]])
    torch.testing.assert_close(b[:, 4, [4, 3, 2, 0]], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(enc.distance_bias(torch.tensor([0, 1, 2, 4])), expected, atol=1e-5, rtol=1e-5)


def test_bias_is_zero_at_distance_zero_and_decreases_monotonically_with_distance():
    torch.manual_seed(0)
    enc = KerpleLog(d_model=64, n_head=8)
    table = enc.distance_bias(torch.arange(4096))  # (H, R): far beyond any training length
    assert torch.all(table[:, 0] == 0)
    assert torch.all(table[:, 1:] < table[:, :-1])  # strictly decreasing in distance, every head


def test_bias_depends_on_positions_only_through_the_distance():
    torch.manual_seed(0)
    enc = KerpleLog(d_model=32, n_head=4)
    q, k = torch.arange(10, 20), torch.arange(0, 10)
    torch.testing.assert_close(enc.position_bias(q, k), enc.position_bias(q + 100, k + 100))


def test_r1_r2_stay_positive_whatever_the_learned_parameters_become():
    enc = KerpleLog(d_model=32, n_head=4)
    with torch.no_grad():
        enc.rho1.fill_(-30.0)
        enc.rho2.copy_(torch.tensor([-30.0, -1.0, 0.0, 30.0]))
    assert torch.all(enc.r1 > 0) and torch.all(enc.r2 > 0)
    assert torch.all(enc.distance_bias(torch.arange(100)) <= 0)  # a penalty, never a reward


def test_initialisation_is_the_papers_and_each_head_learns_its_own_r1_r2():
    """The paper draws r1 ~ U(0, 2), r2 ~ U(0, 1) per head (clamped at 0.01); both get a gradient."""
    torch.manual_seed(0)
    enc = build_encoding(compose(["encoding=kerple", "model.n_head=16", "model.d_model=128"]))
    assert isinstance(enc, KerpleLog) and enc.r1.shape == enc.r2.shape == (16,)
    assert torch.all((enc.r1 >= 0.01 - 1e-6) & (enc.r1 <= 2 + 1e-6))
    assert torch.all((enc.r2 >= 0.01 - 1e-6) & (enc.r2 <= 1 + 1e-6))
    assert len(set(enc.r1.tolist())) == 16  # per head, not shared
    enc.distance_bias(torch.arange(64)).sum().backward()
    assert torch.all(enc.rho1.grad != 0) and torch.all(enc.rho2.grad != 0)
    assert math.isclose(sum(p.numel() for p in enc.parameters()), 2 * 16)
