"""RoPE properties from Su et al. (RoFormer, §3.2-3.4) and the seeds' derivation."""

import math

import pytest
import torch

from posenc.nn.encodings.base import Context
from posenc.nn.encodings.rope import RoPE, apply_rotary


def rotate_at(enc: RoPE, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Rotate x (T, hd) where row t sits at positions[t]."""
    pos = torch.tensor(positions)
    enc.prepare(int(pos.max()) + 1)
    q, _ = enc.transform_qk(x[None, None], x[None, None], Context.at(pos))
    return q[0, 0]


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_score_depends_only_on_relative_position(style, fraction):
    torch.manual_seed(0)
    enc = RoPE(d_model=64, n_head=2, style=style, fraction=fraction)  # head_dim 32
    q, k = torch.randn(32), torch.randn(32)
    for m, n in [(5, 2), (17, 3), (100, 100), (3, 40)]:
        ref = rotate_at(enc, q[None], [m]) @ rotate_at(enc, k[None], [n]).T
        for shift in (1, 7, 1000):
            shifted = rotate_at(enc, q[None], [m + shift]) @ rotate_at(enc, k[None], [n + shift]).T
            torch.testing.assert_close(shifted, ref, atol=1e-4, rtol=1e-4)


def test_rotation_preserves_norm():
    torch.manual_seed(0)
    enc = RoPE(d_model=128, n_head=2)
    x = torch.randn(50, 64)
    out = rotate_at(enc, x, list(range(0, 5000, 100)))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def block_diagonal_rotation(d: int, m: int, base: float = 10000.0) -> torch.Tensor:
    """R^d_{Θ,m} of RoFormer eq. (15): 2x2 rotation blocks by m·θ_i, θ_i = base^(-2i/d)."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        c, s = math.cos(m * theta), math.sin(m * theta)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return R


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_equals_block_diagonal_matrix(base):
    torch.manual_seed(0)
    d = 16
    enc = RoPE(d_model=d, n_head=1, base=base)
    x = torch.randn(d)
    for m in (0, 1, 7, 123):
        expected = (block_diagonal_rotation(d, m, base) @ x.double()).float()
        torch.testing.assert_close(rotate_at(enc, x[None], [m])[0], expected, atol=1e-4, rtol=1e-4)


def test_half_equals_interleaved_after_permutation():
    """half pairs (x[i], x[i+d/2]); interleaved pairs (x[2i], x[2i+1]): the same rotation
    once dims are permuted, so the attention scores agree exactly."""
    torch.manual_seed(0)
    d = 32
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # interleaved -> half layout
    inter, half = RoPE(d, 1, style="interleaved"), RoPE(d, 1, style="half")
    q, k = torch.randn(10, d), torch.randn(10, d)
    pos = list(range(3, 13))
    qi, ki = rotate_at(inter, q, pos), rotate_at(inter, k, pos)
    qh, kh = rotate_at(half, q[:, perm], pos), rotate_at(half, k[:, perm], pos)
    torch.testing.assert_close(qh, qi[:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(qh @ kh.T, qi @ ki.T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_partial_rotary_leaves_the_rest_untouched(style):
    torch.manual_seed(0)
    enc = RoPE(d_model=32, n_head=1, fraction=0.5, style=style)
    x = torch.randn(8, 32)
    out = rotate_at(enc, x, list(range(100, 108)))
    torch.testing.assert_close(out[:, 16:], x[:, 16:])
    assert not torch.allclose(out[:, :16], x[:, :16])


def test_position_zero_is_identity():
    enc = RoPE(d_model=32, n_head=1)
    x = torch.randn(1, 32)
    torch.testing.assert_close(rotate_at(enc, x, [0]), x)


def test_computed_in_fp32_and_cast_back():
    enc = RoPE(d_model=64, n_head=1)
    x = torch.randn(4, 64)
    pos = [5000, 5001, 5002, 5003]
    out_bf16 = rotate_at(enc, x.bfloat16(), pos)
    assert out_bf16.dtype == torch.bfloat16
    # angles at p=5000 are large: computing them in bf16 would be wildly off; fp32 keeps the
    # result within bf16 rounding of the fp32 rotation
    torch.testing.assert_close(out_bf16.float(), rotate_at(enc, x.bfloat16().float(), pos), atol=0.05, rtol=0.02)


def test_cache_grows_on_demand_and_is_not_in_checkpoints():
    enc = RoPE(d_model=32, n_head=1)
    enc.prepare(16)
    assert enc.cos_cached.shape[0] >= 16
    enc.prepare(10_000)
    assert enc.cos_cached.shape[0] >= 10_000
    assert enc.state_dict() == {}  # caches are non-persistent buffers


@pytest.mark.parametrize("kwargs", [{"style": "diagonal"}, {"fraction": 0.0}, {"fraction": 1.5}, {"base": 1.0}])
def test_bad_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        RoPE(d_model=32, n_head=1, **kwargs)


def test_apply_rotary_shapes():
    x = torch.randn(2, 3, 5, 8)
    cos, sin = torch.ones(5, 4), torch.zeros(5, 4)
    assert torch.equal(apply_rotary(x, cos, sin, "interleaved"), x)
