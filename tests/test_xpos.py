"""xPos (Sun et al., 2022): scores depend only on n − m and decay with distance."""

from __future__ import annotations

import pytest
import torch

from posenc.nn.encodings.base import Context
from posenc.nn.encodings.rope import RoPE
from posenc.nn.encodings.xpos import XPos, xpos_zeta


def score(enc, q, k, n: int, m: int, length: int = 4096) -> float:
    """<f_q(q, n), f_k(k, m)> for a query at n and a key at m. q, k: (hd,)"""
    enc.prepare(length)
    rq, _ = enc.transform_qk(q[None, None, None], q[None, None, None], Context.at(torch.tensor([n])))
    _, rk = enc.transform_qk(k[None, None, None], k[None, None, None], Context.at(torch.tensor([m])))
    return float((rq * rk).sum())


def test_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    enc = XPos(d_model=64, n_head=2, scale_base=64)
    q, k = torch.randn(2, 32).unbind(0)
    for distance in (0, 1, 7, 100):
        scores = [score(enc, q, k, m + distance, m, length) for m, length in ((0, 200), (37, 300), (900, 2048))]
        assert scores == pytest.approx([scores[0]] * 3, rel=1e-4, abs=1e-5)


def test_each_pair_decays_as_zeta_to_the_distance_over_scale_base():
    """Against RoPE, pair i of the score is multiplied by ζ_i^((n−m)/B) < 1: smaller with
    distance, and smallest for the fast-rotating pairs (small i)."""
    B = 64.0
    xpos, rope = XPos(d_model=64, n_head=2, scale_base=B), RoPE(d_model=64, n_head=2)
    zeta = xpos_zeta(32)
    assert torch.all(zeta < 1) and torch.all(zeta[1:] > zeta[:-1])
    for i in (0, 5, 15):
        q = torch.zeros(32)
        q[2 * i] = 1.0  # only pair i is non-zero
        ratios = [score(xpos, q, q, n=50 + r, m=50) / score(rope, q, q, n=50 + r, m=50) for r in (0, 20, 40, 80)]
        expected = [zeta[i].item() ** (r / B) for r in (0, 20, 40, 80)]
        assert ratios == pytest.approx(expected, rel=1e-4)
        assert ratios == sorted(ratios, reverse=True)


def test_without_decay_xpos_is_rope():
    """ζ_i = (2i/d + γ)/(1 + γ) -> 1 as γ grows: the decay vanishes and xPos is RoPE (Sun et al. §3.2)."""
    torch.manual_seed(1)
    xpos, rope = XPos(d_model=64, n_head=2, gamma=1e9), RoPE(d_model=64, n_head=2)
    q, k = torch.randn(2, 32).unbind(0)
    for n, m in ((5, 2), (300, 17), (40, 40)):
        assert score(xpos, q, k, n, m) == pytest.approx(score(rope, q, k, n, m), rel=1e-4, abs=1e-5)


def test_the_eager_complex_product_is_the_papers_real_formula_forward_and_backward():
    """Eager xPos multiplies pairs by ζ^(±n/B)·e^{inθ} as one complex product; the real formula
    (apply_rotary on ζ-scaled cos and sin, what compiled code runs) gives the same q, k and
    gradients, in float64."""
    from posenc.nn.encodings.rope import apply_rotary

    torch.manual_seed(2)
    enc = XPos(d_model=64, n_head=2, scale_base=16)
    enc.prepare(40)
    ctx = Context.arange(40, dtype=torch.float64)
    q0, k0 = (torch.randn(2, 2, 40, 32, dtype=torch.float64) for _ in range(2))
    g = torch.randn(2, 2, 40, 32, dtype=torch.float64)

    def run(fn):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        rq, rk = fn(q, k)
        ((rq * g).sum() + (rk * g.flip(-1)).sum()).backward()
        return rq.detach(), rk.detach(), q.grad, k.grad

    def real(q, k):
        cos, sin = enc.cos_and_sin(ctx)
        scale = enc.zeta_powers(ctx.pos)
        return apply_rotary(q, cos * scale, sin * scale, "interleaved"), apply_rotary(k, cos / scale, sin / scale, "interleaved")

    for ours, theirs in zip(run(lambda q, k: enc.transform_qk(q, k, ctx)), run(real)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
