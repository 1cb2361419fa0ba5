"""Every attention path computes the same attention: softmax(q·kᵀ/√d + bias + causal) v.

The reference is that formula written out in float64 with an explicit mask. The paths are
SDPA is_causal (no bias), SDPA with the dense float mask, the query-chunked path (long
sequences), and FlexAttention with the encoding's score_mod and a causal BlockMask (its
forward runs eagerly on CPU; its backward and the compiled kernel only on CUDA).
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch

from posenc.nn import attention
from posenc.config import compose
from posenc.config import group_options
from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.flex import causal_block_mask, flex_bias
from posenc.build import build_model

ENCODINGS = group_options("encoding")
B, H, T, HD = 2, 4, 24, 8
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@functools.cache
def tiny_config(name: str):
    return compose([f"encoding={name}", "model.n_layer=2", "model.n_head=4", "model.d_model=32", "trainer.seq_len=64"])


def tiny_model(name: str, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(name), vocab_size=64).to(device)
    for p in model.encoding.parameters():  # T5's table starts at zero: make the bias visible
        torch.nn.init.normal_(p, std=0.5)
    return model


BIASED = [n for n in ENCODINGS if tiny_model(n).encoding.has_bias]


def reference(q, k, v, bias):
    """softmax(q kᵀ/√d + bias, future masked) v, spelled out."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


def rotated_qkv(encoding: PositionalEncoding):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, T, HD, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(T)
    encoding.prepare(T)
    q, k = encoding.rotate(q, k, pos)
    return q, k, v, pos


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_cpu_path_equals_the_masked_reference(name):
    encoding = tiny_model(name).encoding.double()
    q, k, v, pos = rotated_qkv(encoding)
    bias = encoding.bias(pos, pos)  # (H, T, T) or None
    expected = reference(q, k, v, bias)
    chosen = attention.attention_bias(encoding, pos, T, torch.float64, 0.0)
    assert (chosen is None) == (not encoding.has_bias)
    torch.testing.assert_close(attention.causal_attention(q, k, v, chosen), expected)
    if encoding.has_bias:  # the long-sequence path, in chunks that do not divide T
        chunked = attention.chunked_biased_attention(q, k, v, chosen, chunk=5)
        torch.testing.assert_close(chunked, expected)


@pytest.mark.parametrize("name", BIASED)
def test_score_mod_is_the_bias_computed_on_the_fly(name):
    """Every biased encoding offers FlexAttention a score_mod, and score_mod(0, h, i, j) is
    bias[h, i, j] wherever key j is visible to query i."""
    encoding = tiny_model(name).encoding.double()
    pos = torch.arange(T)
    encoding.prepare(T)
    mod = encoding.score_mod(pos, T)
    assert mod is not None, f"{name} has a bias but offers no score_mod: it would fall back on CUDA"
    h, i, j = torch.arange(H)[:, None, None], torch.arange(T)[None, :, None], torch.arange(T)[None, None, :]
    on_the_fly = mod(torch.zeros(H, T, T, dtype=torch.float64), torch.tensor(0), h, i, j)
    visible = (j <= i).expand(H, T, T)
    torch.testing.assert_close(on_the_fly[visible], encoding.bias(pos, pos)[visible])


@pytest.mark.parametrize("name", BIASED)
def test_flex_forward_equals_the_masked_reference(name):
    from torch.nn.attention.flex_attention import flex_attention

    encoding = tiny_model(name).encoding.double()
    q, k, v, pos = rotated_qkv(encoding)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is slow: it is a check
        out = flex_attention(q, k, v, score_mod=encoding.score_mod(pos, T),
                             block_mask=causal_block_mask(T, torch.device("cpu")))
    torch.testing.assert_close(out, reference(q, k, v, encoding.bias(pos, pos)))


@pytest.mark.parametrize("name", BIASED)
def test_model_dense_and_chunked_paths_agree(name, monkeypatch):
    model = tiny_model(name).double()
    idx = torch.randint(64, (2, 40), generator=torch.Generator().manual_seed(2))
    dense, _ = model(idx)
    monkeypatch.setattr(attention, "DENSE_BIAS_MAX_LEN", 0)
    monkeypatch.setattr(attention, "QUERY_CHUNK", 7)
    chunked, _ = model(idx)
    torch.testing.assert_close(chunked, dense)


class AbsoluteBias(PositionalEncoding):
    """A bias that is not a function of i - j: it offers no score_mod."""

    has_bias = True

    def bias(self, q_pos, k_pos):
        return (q_pos[:, None] * k_pos[None, :]).float().expand(self.n_head, -1, -1)


def test_an_encoding_without_score_mod_falls_back_with_one_warning():
    encoding, pos = AbsoluteBias(32, 4, name="absolute"), torch.arange(8)
    with pytest.warns(RuntimeWarning, match="offers no score_mod"):
        assert flex_bias(encoding, pos, 8) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second forward must not warn again
        assert flex_bias(encoding, pos, 8) is None


# --- CUDA only --------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("name", BIASED)
def test_flex_training_path_equals_masked_path_on_cuda(name, monkeypatch):
    """Logits and every gradient (T5's table included, through the score_mod) match SDPA."""
    idx = torch.randint(64, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    results = []
    for use_flex in (True, False):
        model = tiny_model(name, "cuda")
        if not use_flex:
            monkeypatch.setattr(attention, "flex_bias", lambda *a: None)
        else:
            assert isinstance(attention.attention_bias(model.encoding, torch.arange(256, device="cuda"),
                                                       256, torch.float32, 0.0), attention.FlexBias)
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (flex_logits, flex_grads), (sdpa_logits, sdpa_grads) = results
    torch.testing.assert_close(flex_logits, sdpa_logits, atol=2e-3, rtol=2e-3)
    assert flex_grads.keys() == sdpa_grads.keys()
    for n in flex_grads:
        torch.testing.assert_close(flex_grads[n], sdpa_grads[n], atol=2e-3, rtol=2e-2, msg=n)


@cuda
@pytest.mark.parametrize("name", ENCODINGS)
def test_compiled_bf16_model_matches_eager_on_cuda(name):
    model = tiny_model(name, "cuda")
    idx = torch.randint(64, (2, 128), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager, _ = model(idx)
        compiled, loss = torch.compile(model)(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    torch.testing.assert_close(compiled.float(), eager.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_fast_rope_is_the_papers_rotation(style, fraction):
    """Whatever kernel rotate uses (one complex product, flip + addcmul), each pair (a, b) of
    q and k becomes (a cos mθ_i - b sin mθ_i, a sin mθ_i + b cos mθ_i) (RoFormer eq. 13)."""
    from posenc.nn.encodings.rope import RoPE

    rope = RoPE(H * HD, H, base=100.0, fraction=fraction, style=style)
    q, k, v, pos = rotated_qkv(PositionalEncoding(H * HD, H))  # unrotated
    rope.prepare(T)
    theta = pos[:, None].double() * rope.inv_freq.double()  # (T, rot/2)
    half = rope.rot_dim // 2
    first = torch.arange(half) * 2 if style == "interleaved" else torch.arange(half)
    second = first + 1 if style == "interleaved" else first + half
    for x, rotated in zip((q, k), rope.rotate(q, k, pos)):
        a, b = x[..., first], x[..., second]
        expected = x.clone()
        expected[..., first] = a * theta.cos() - b * theta.sin()
        expected[..., second] = a * theta.sin() + b * theta.cos()
        torch.testing.assert_close(rotated, expected, atol=1e-5, rtol=1e-5)  # rotated in fp32
