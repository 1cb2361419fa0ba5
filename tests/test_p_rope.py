"""p-RoPE (Barbero et al., ICLR 2025): the highest fraction p of RoPE's full-spectrum frequencies
rotate, exactly as in RoPE; the lowest (1 - p) pass through unrotated."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.build import build_encoding
from posenc.config import compose
from posenc.errors import UserError
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.p_rope import PRoPE
from posenc.nn.encodings.rope import RoPE

# head_dim 8, base 10000: the full spectrum is θ_i = 10000^(-2i/8) = 10^(-i) = 1, 0.1, 0.01, 0.001
D_MODEL, N_HEAD, HEAD_DIM = 16, 2, 8
X = torch.arange(1.0, 9.0).expand(1, N_HEAD, 1, HEAD_DIM)  # (B, H, T=1, hd): x_d = d + 1


def rotate_at(encoding, m: int, x: torch.Tensor = X) -> torch.Tensor:
    """x rotated as a token at position m: (1, H, 1, hd) -> (1, H, 1, hd)."""
    encoding.prepare(m + 1)
    q, _ = encoding.transform_qk(x, x, Context.at(torch.tensor([m])))
    return q


def pair(a: float, b: float, angle: float) -> list[float]:
    """RoFormer's rotation of one pair (a, b) by the angle."""
    return [a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)]


def test_half_the_frequencies_interleaved_by_hand():
    """p = 0.5 of head_dim 8 keeps floor(0.5·8/2) = 2 frequencies, θ_0 = 1 and θ_1 = 0.1 of the
    full spectrum: at position 2, pair (x0, x1) turns by 2 rad, (x2, x3) by 0.2 rad, and the
    dims of θ_2 = 0.01 and θ_3 = 0.001 (x4..x7) are passed through unchanged."""
    out = rotate_at(PRoPE(D_MODEL, N_HEAD, p=0.5, style="interleaved"), m=2)
    expected = torch.tensor(pair(1, 2, 2.0) + pair(3, 4, 0.2) + [5, 6, 7, 8])
    torch.testing.assert_close(out[0, 0, 0], expected)
    assert torch.equal(out[..., 4:], X[..., 4:])  # exactly, not approximately


def test_half_the_frequencies_half_style_by_hand():
    """style=half pairs (x[i], x[i + d/2]) (GPT-NeoX, Gemma): pairs (x0, x4) and (x1, x5) turn by
    2 and 0.2 rad; the pairs of the lowest frequencies, (x2, x6) and (x3, x7), pass through."""
    out = rotate_at(PRoPE(D_MODEL, N_HEAD, p=0.5, style="half"), m=2)[0, 0, 0]
    (a0, b0), (a1, b1) = pair(1, 5, 2.0), pair(2, 6, 0.2)
    torch.testing.assert_close(out, torch.tensor([a0, a1, 3, 4, b0, b1, 7, 8]))


def test_p_rope_keeps_the_full_spectrum_where_rope_fraction_re_spreads_it():
    """The difference from GPT-NeoX's partial rotary: rope's fraction=0.5 rotates x0..x3 with
    θ re-spread over the 4 rotated dims (1 and 10000^(-2/4) = 0.01), p-RoPE with θ_0 = 1 and
    θ_1 = 0.1 of the whole head_dim; both leave x4..x7 alone."""
    partial = rotate_at(RoPE(D_MODEL, N_HEAD, fraction=0.5), m=2)[0, 0, 0]
    p_rope = rotate_at(PRoPE(D_MODEL, N_HEAD, p=0.5), m=2)[0, 0, 0]
    torch.testing.assert_close(partial[2:4], torch.tensor(pair(3, 4, 0.02)))
    torch.testing.assert_close(p_rope[2:4], torch.tensor(pair(3, 4, 0.2)))
    torch.testing.assert_close(partial[:2], p_rope[:2])  # θ_0 = 1 in both


@pytest.mark.parametrize(("p", "head_dim", "kept"), [(0.75, 32, 12), (0.5, 8, 2), (0.3, 8, 1), (0.25, 64, 8)])
def test_it_keeps_floor_of_p_times_half_head_dim_highest_frequencies(p, head_dim, kept):
    """floor(p·d/2) frequencies, as the authors' code counts them (int(p * head_dim // 2)): those
    are RoPE's first (highest) θ_i, unchanged; every lower one is 0."""
    p_rope, rope = PRoPE(head_dim * 2, 2, p=p), RoPE(head_dim * 2, 2)
    assert p_rope.n_rotated == kept
    torch.testing.assert_close(p_rope.inv_freq[:kept], rope.inv_freq[:kept])
    assert torch.all(p_rope.inv_freq[kept:] == 0)


def test_p_one_is_rope_and_p_zero_is_nope():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, N_HEAD, 12, HEAD_DIM, generator=g)
    ctx = Context.arange(12)
    rope, full, none = RoPE(D_MODEL, N_HEAD), PRoPE(D_MODEL, N_HEAD, p=1.0), PRoPE(D_MODEL, N_HEAD, p=0.0)
    for enc in (rope, full, none):
        enc.prepare(12)
    torch.testing.assert_close(full.transform_qk(q, q, ctx)[0], rope.transform_qk(q, q, ctx)[0])
    assert torch.equal(none.transform_qk(q, q, ctx)[0], q)


def test_scores_on_the_unrotated_dims_do_not_depend_on_position():
    """The lowest frequencies act as position-free ("semantic") channels: q·k over their dims is
    the same whatever the positions of q and k."""
    enc = PRoPE(D_MODEL, N_HEAD, p=0.5)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, N_HEAD, 1, HEAD_DIM, generator=g), torch.randn(1, N_HEAD, 1, HEAD_DIM, generator=g)
    scores = []
    for m, n in [(0, 0), (7, 3), (40, 1)]:
        qm, kn = rotate_at(enc, m, q), rotate_at(enc, n, k)
        scores.append((qm[..., 4:] * kn[..., 4:]).sum())
    torch.testing.assert_close(scores[1], scores[0])
    torch.testing.assert_close(scores[2], scores[0])


def test_eval_time_scaling_applies_to_the_kept_frequencies_only():
    linear = dict(scaling="linear", scaling_factor=4.0, original_max_len=64)
    p_rope, rope = PRoPE(64, 2, p=0.5, **linear), RoPE(64, 2, **linear)
    torch.testing.assert_close(p_rope.inv_freq[:8], rope.inv_freq[:8])
    assert torch.all(p_rope.inv_freq[8:] == 0)


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
def test_length_dependent_scaling_keeps_the_lowest_frequencies_unrotated(scaling):
    """Dynamic NTK and LongRoPE recompute θ for each running length: the dropped frequencies
    must stay dropped at every length, not only at the one the encoding was built for."""
    p_rope = PRoPE(64, 2, p=0.5, scaling=scaling, scaling_factor=4.0, original_max_len=64)
    for length in (64, 256, 1024):
        p_rope.prepare(length)
        assert torch.all(p_rope.inv_freq[8:] == 0) and torch.all(p_rope.inv_freq[:8] > 0), length


def test_an_invalid_p_is_one_error_line():
    with pytest.raises(UserError, match="encoding.p must be in"):
        build_encoding(compose(["encoding=p_rope", "encoding.p=1.5"]))
    enc = build_encoding(compose(["encoding=p_rope", "model.d_model=128", "model.n_head=4"]))
    assert enc.options()["p"] == 0.75 and enc.n_rotated == 12  # the YAML default: 0.75 of 32/2 pairs
