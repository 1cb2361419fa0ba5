"""Causal linear attention with RoPE (RoFormer §3.3, eq. 19)."""

from __future__ import annotations

import pytest
import torch

from posenc.nn.linear_attention import causal_linear_attention, elu_feature_map
from posenc.nn.encodings.alibi import ALiBi
from posenc.nn.encodings.base import Context, NoPE
from posenc.nn.encodings.rope import RoPE
from posenc.nn.model import GPT


def eq19(q, k, v, enc, pos):
    """Eq. (19) written out as sums over n <= m (the quadratic reference)."""
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    rq, rk = enc.transform_qk(fq, fk, Context.at(pos))
    T = q.shape[-2]
    out = torch.empty_like(v)
    for m in range(T):
        num = sum((rq[..., m, :] * rk[..., n, :]).sum(-1, keepdim=True) * v[..., n, :] for n in range(m + 1))
        den = sum((fq[..., m, :] * fk[..., n, :]).sum(-1, keepdim=True) for n in range(m + 1))
        out[..., m, :] = num / den
    return out


def qkv(T=12, H=2, hd=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 2, H, T, hd, generator=g).unbind(0)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_cumulative_form_equals_equation_19(chunk):
    q, k, v = qkv()
    enc = RoPE(d_model=16, n_head=2)
    pos = torch.arange(12)
    enc.prepare(12)
    out = causal_linear_attention(q, k, v, lambda a, b: enc.transform_qk(a, b, Context.at(pos)), chunk=chunk)
    reference = eq19(q.double(), k.double(), v.double(), enc, pos)
    torch.testing.assert_close(out, reference.float(), rtol=1e-4, atol=1e-5)


def test_rope_numerator_depends_only_on_relative_position():
    """Shifting every position by c leaves (R_m φ(q))ᵀ(R_n φ(k)) and hence the output unchanged."""
    q, k, v = qkv(T=20)
    enc = RoPE(d_model=16, n_head=2)
    enc.prepare(1000)
    outs = [causal_linear_attention(q, k, v, lambda a, b, p=torch.arange(20) + c: enc.transform_qk(a, b, Context.at(p)))
            for c in (0, 13, 900)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[2], outs[0], rtol=1e-4, atol=1e-5)
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    scores = [(lambda r: r[0] @ r[1].transpose(-1, -2))(enc.transform_qk(fq, fk, Context.at(torch.arange(20) + c))) for c in (0, 13)]
    torch.testing.assert_close(scores[1], scores[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoding", [RoPE(d_model=32, n_head=2), NoPE(d_model=32, n_head=2)])
def test_linear_gpt_is_causal(encoding):
    torch.manual_seed(0)
    model = GPT(vocab_size=50, encoding=encoding, n_layer=2, n_head=2, d_model=32, attention="linear").eval()
    idx = torch.randint(0, 50, (2, 40))
    changed = idx.clone()
    t = 17
    changed[:, t + 1] = (idx[:, t + 1] + 1) % 50
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_linear_attention_trains():
    torch.manual_seed(0)
    model = GPT(vocab_size=8, encoding=RoPE(d_model=32, n_head=2), n_layer=1, n_head=2, d_model=32, attention="linear")
    idx = torch.arange(33).remainder(8)[None].repeat(2, 1)  # a periodic sequence: learnable
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_a_bias_encoding_is_refused():
    with pytest.raises(ValueError, match="model.attention=linear has no score matrix"):
        GPT(vocab_size=50, encoding=ALiBi(d_model=32, n_head=2), n_layer=1, n_head=2, d_model=32, attention="linear")


def test_float64_inputs_are_computed_in_float64_so_a_prefix_equals_itself_alone():
    """posenc check compares paths in float64 at 1e-10: the first t outputs of a window must be those
    of the t tokens alone to that precision (cast to float32, t and T rows rounded apart by ~1e-7)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 100, 64, generator=g, dtype=torch.float64) for _ in range(3))
    full = causal_linear_attention(q, k, v)
    assert full.dtype == torch.float64
    for t in (1, 5, 50, 99):
        alone = causal_linear_attention(q[..., :t, :], k[..., :t, :], v[..., :t, :])
        assert (full[..., :t, :] - alone).abs().max() < 1e-12
