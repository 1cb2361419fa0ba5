"""Which attention path runs, and the paths `posenc check` does not run on a CPU.

Every path (SDPA is_causal, the dense float mask, the query-chunked path of long sequences,
FlexAttention's eager forward) against the float64 reference, under causal, document and window
masks, and score_mod = position_bias = distance_bias, for every encoding: `posenc check`
(posenc/check/paths.py), run on each in tests/test_check.py. Here: FlexAttention
as CUDA compiles it (traced by dynamo, run eagerly on the CPU), the kernel choice, and RoPE's fast rotation.
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch

from posenc import errors
from posenc.nn import attention
from posenc.config import compose, group_options
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.mask import GLOBAL, static_block_mask
from posenc.build import build_model
from posenc.nn.kernels import KernelPolicy

ENCODINGS = group_options("encoding")
B, H, T, HD = 2, 4, 24, 8
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@functools.cache
def tiny_config(name: str, *overrides: str):
    return compose([f"encoding={name}", "model.n_layer=2", "model.n_head=4", "model.d_model=32", "trainer.seq_len=64",
                    *overrides])


def tiny_model(name: str, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(tiny_config(name), vocab_size=64).to(device)
    for p in model.encoding.parameters():  # T5's table starts at zero: make the bias visible
        torch.nn.init.normal_(p, std=0.5)
    return model




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
    q, k = encoding.transform_qk(q, k, Context.arange(T, dtype=torch.float64))
    return q, k, v, pos


# One closed-form score_mod (ALiBi's slopes by head) and one that reads a captured table by a
# bucket index computed from i - j (T5's) stand for the rest: every biased encoding's score_mod
# equals its bias in FlexAttention's eager forward (test_check.py), and tests/test_cuda.py runs
# every encoding through posenc's compiled kernel on a GPU.
COMPILED_ON_CPU = ["alibi", "t5_bias"]


@pytest.mark.parametrize("name", COMPILED_ON_CPU)
def test_compiled_flex_kernel_equals_the_masked_reference(name):
    """What CUDA compiles, traced as CUDA traces it: dynamo captures the score_mod whole
    (fullgraph), its tables lifted into the graph, and the traced FlexAttention gives the
    dense-bias attention (head_dim 16, T = 128). The graph runs on AOTAutograd's eager backend:
    inductor's codegen here would be CPU C++, a path posenc never takes (on a CPU a bias goes
    to SDPA as a mask, attention.select_kernel) and costs 20 s of g++ with a cold cache; the
    Triton kernel itself is test_cuda.py's."""
    from torch.nn.attention.flex_attention import flex_attention

    encoding = tiny_model(name).encoding
    assert encoding.offers("position_bias")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 128, 16, generator=g) for _ in range(3))
    pos = torch.arange(128)
    encoding.prepare(128)
    traced = torch.compile(flex_attention, backend="aot_eager", dynamic=False, fullgraph=True)
    with torch.no_grad():
        out = traced(q, k, v, score_mod=encoding.score_mod(Context.arange(128)),
                     block_mask=static_block_mask(128, GLOBAL, torch.device("cpu")))
        expected = reference(q.double(), k.double(), v.double(), encoding.position_bias(pos, pos).double())
    torch.testing.assert_close(out, expected.float(), atol=1e-5, rtol=1e-4)


class AbsoluteBias(PositionalEncoding):
    """A bias that is not a function of i - j: it offers no score_mod."""

    def position_bias(self, q_pos, k_pos):
        return (q_pos[:, None] * k_pos[None, :]).float().expand(self.n_head, -1, -1)


def test_overriding_bias_is_what_makes_an_encoding_biased():
    """No flag to remember: a subclass that overrides bias has one, and attention uses it."""
    encoding = AbsoluteBias(32, 4, name="absolute")
    assert encoding.offers("position_bias") and not PositionalEncoding(32, 4).offers("position_bias")
    assert not encoding.offers("distance_bias") and encoding.score_mod(Context.arange(4)) is None
    q, k, v, pos = rotated_qkv(PositionalEncoding(32, 4))
    chosen = attention.plan(encoding, Context.arange(T, dtype=torch.float64), 0, 0.0, KernelPolicy())
    expected = reference(q, k, v, encoding.position_bias(pos, pos).double())
    torch.testing.assert_close(attention.attend(q, k, v, chosen), expected)


@pytest.mark.parametrize(("device", "head_dim", "dropout", "offers", "replaces", "flex", "kernel", "why"), [
    ("cpu", 64, 0.0, True, False, True, "sdpa", None),            # CPU: FlexAttention has no backward
    ("cuda", 64, 0.0, True, False, True, "flex", None),
    ("cuda", 8, 0.0, True, False, True, "sdpa", "head_dim >= 16"),
    ("cuda", 64, 0.1, True, False, True, "sdpa", "dropout"),
    ("cuda", 64, 0.0, False, False, True, "sdpa", "no score_mod"),
    ("cuda", 64, 0.0, True, True, True, "sdpa", "replaces softmax"),  # stick-breaking
    ("cuda", 64, 0.0, True, False, False, "sdpa", "not available"),
])
def test_the_kernel_follows_what_the_encoding_offers_and_the_device_can_do(device, head_dim, dropout, offers,
                                                                            replaces, flex, kernel, why):
    chosen, reason = attention.select_kernel(device, head_dim, dropout, offers, replaces, flex_available=flex)
    assert chosen == kernel
    assert (reason is None) if why is None else (why in reason)


def test_a_fallback_warns_once_per_reason(monkeypatch):
    """A forward that falls back from FlexAttention says why, once: not again on the next forward."""
    monkeypatch.setattr(errors, "_WARNED", set())
    monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("sdpa", "FlexAttention needs head_dim >= 16"))
    encoding, policy = tiny_model("alibi").encoding, KernelPolicy()  # one run's plans
    monkeypatch.setattr(Context, "device", property(lambda self: torch.device("cuda")))
    with pytest.warns(RuntimeWarning, match="encoding 'alibi'.*because FlexAttention needs head_dim >= 16"):
        first = attention.plan(encoding, Context.arange(T), 0, 0.0, policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second forward must not warn again
        second = attention.plan(encoding, Context.arange(T), 0, 0.0, policy)
    assert isinstance(first, attention.DensePlan) and isinstance(second, attention.DensePlan)


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
    for x, rotated in zip((q, k), rope.transform_qk(q, k, Context.arange(T))):
        a, b = x[..., first], x[..., second]
        expected = x.clone()
        expected[..., first] = a * theta.cos() - b * theta.sin()
        expected[..., second] = a * theta.sin() + b * theta.cos()
        torch.testing.assert_close(rotated, expected, atol=1e-5, rtol=1e-5)  # rotated in fp32


@pytest.mark.parametrize("name", ["rope", "nope", "sinusoidal", "rope layout=sliding layout.window=32"])
def test_a_model_without_a_bias_compiles_to_one_graph(name):
    """torch.compile of the model (trainer.compile, the default on CUDA) traces one graph: nothing in
    the forward breaks it (a graph break costs a round trip to Python and splits the kernels inductor
    can fuse, every step). A mask's default window once broke it in every forward, and on torch 2.11
    every mask the forward built did (its window a default of AttentionMask's __init__), a layout's too."""
    import torch._dynamo

    encoding, *layout = name.split()
    model = build_model(tiny_config(encoding, *layout), vocab_size=64).eval()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(torch.randint(64, (2, 64)))
    assert explained.graph_break_count == 0, [r.reason.splitlines()[0] for r in explained.break_reasons]
