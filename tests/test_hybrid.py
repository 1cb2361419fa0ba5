"""RoPE/NoPE hybrids (Llama 4; Yang et al., 2025) and Llama 4's log attention temperature: the
NoPE layers ignore position, the RoPE layers are RoPE, and the temperature is 1 on every
position of the training length."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.build import build_encoding, build_model
from posenc.config import compose
from posenc.errors import UserError
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.rope import RoPE
from posenc.nn.attention import encode
from posenc.nn.encodings.rope_nope import RoPENoPE, interleaved_nope_layers, log_temperature

D_MODEL, N_HEAD, HEAD_DIM = 32, 4, 8


def qk(T: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, N_HEAD, T, HEAD_DIM, generator=g), torch.randn(2, N_HEAD, T, HEAD_DIM, generator=g)


def test_every_fourth_layer_is_nope_as_in_llama4():
    """Llama 4 rotates layer l (0-based) unless (l + 1) % 4 == 0; counted back from the last
    layer, the same layers whenever n_layer is a multiple of 4."""
    for n_layer in (4, 8, 48):
        assert interleaved_nope_layers(n_layer, 4) == {l for l in range(n_layer) if (l + 1) % 4 == 0}


@pytest.mark.parametrize(("n_layer", "every", "nope"), [(2, 4, {1}), (1, 4, {0}), (6, 2, {1, 3, 5}), (3, 1, {0, 1, 2})])
def test_a_model_shallower_than_nope_every_still_has_its_last_layer_nope(n_layer, every, nope):
    assert interleaved_nope_layers(n_layer, every) == nope


def test_nope_layers_may_be_listed_and_are_checked():
    enc = build_encoding(compose(["encoding=rope_nope", "model.n_layer=4", "encoding.nope_layers=[0,2]"]))
    assert enc.nope_layers == {0, 2}
    with pytest.raises(UserError, match=r"nope_layers=\[4\] must be layer indices in 0..3"):
        build_encoding(compose(["encoding=rope_nope", "model.n_layer=4", "encoding.nope_layers=[4]"]))
    with pytest.raises(UserError, match="temperature must be one of"):
        build_encoding(compose(["encoding=rope_nope", "encoding.temperature=linear"]))


@pytest.mark.parametrize("shift", [0, 17, 1000])
def test_nope_layers_are_unaffected_by_position_and_rope_layers_are_rope(shift):
    """Shifting positions changes nothing in a NoPE layer's q and k (they are returned as they
    came); a RoPE layer's q and k are RoPE's, which do change with absolute position."""
    enc, rope = RoPENoPE(D_MODEL, N_HEAD, n_layer=4, nope_every=2), RoPE(D_MODEL, N_HEAD)
    assert enc.nope_layers == {1, 3}
    q, k = qk(10)
    ctx = Context.at(torch.arange(10) + shift)
    enc.prepare(ctx.n_positions)
    rope.prepare(ctx.n_positions)
    for layer in (1, 3):
        out_q, out_k = enc.transform_qk(q, k, ctx, layer)
        assert torch.equal(out_q, q) and torch.equal(out_k, k)
    for layer in (0, 2):
        for out, ref in zip(enc.transform_qk(q, k, ctx, layer), rope.transform_qk(q, k, ctx)):
            torch.testing.assert_close(out, ref)
    if shift:
        assert not torch.allclose(enc.transform_qk(q, k, ctx, 0)[0], enc.transform_qk(q, k, Context.arange(10), 0)[0])


def test_in_the_model_only_the_rope_layers_see_position():
    """Through a real forward at shifted positions: the NoPE layer's rotate returns its q, k
    untouched, the RoPE layer's does not."""
    model = build_model(compose(["encoding=rope_nope", "model.n_layer=2", "model.d_model=32", "model.n_head=4",
                                 "trainer.seq_len=16"]), vocab_size=64).eval()
    seen: dict[int, bool] = {}
    transform_qk = model.encoding.transform_qk

    def spy(q, k, ctx, layer=0):
        out_q, out_k = transform_qk(q, k, ctx, layer)
        seen[layer] = torch.equal(out_q, q) and torch.equal(out_k, k)
        return out_q, out_k

    model.encoding.transform_qk = spy
    with torch.no_grad():
        model(torch.randint(64, (2, 12)), pos=torch.arange(12) + 50)
    assert seen == {0: False, 1: True}  # layer 1, the last, is NoPE


def test_the_temperature_is_one_within_the_training_length_and_llama4s_log_beyond():
    """τ(m) = 1 + β·ln(⌊m/L⌋ + 1): exactly 1 at every position 0..L-1, then 1 + 0.1·ln 2 on
    L..2L-1, 1 + 0.1·ln 3 on 2L..3L-1, and 1 + 0.1·ln 16 on the last window of 16L."""
    L = 64
    assert torch.equal(log_temperature(torch.arange(L), L, 0.1), torch.ones(L))
    tau = log_temperature(torch.tensor([L, 2 * L - 1, 2 * L, 3 * L - 1, 16 * L - 1]), L, 0.1)
    expected = [1 + 0.1 * math.log(2)] * 2 + [1 + 0.1 * math.log(3)] * 2 + [1 + 0.1 * math.log(16)]
    torch.testing.assert_close(tau, torch.tensor(expected))


@pytest.mark.parametrize("layers", ["nope", "all"])
def test_the_temperature_scales_each_querys_logits_on_its_layers(layers):
    """Beyond L, query m's q (hence its logits q·k/√d) is multiplied by τ(m) on the NoPE layers
    (Llama 4) or on every layer, through the contract's logit scale; keys are left alone."""
    L, T = 4, 12
    kw = dict(n_layer=2, nope_every=2, temperature_beta=0.5, original_max_len=L)
    plain = RoPENoPE(D_MODEL, N_HEAD, **kw)
    tempered = RoPENoPE(D_MODEL, N_HEAD, temperature="log", temperature_layers=layers, **kw)
    q, k = qk(T)
    ctx = Context.arange(T)
    plain.prepare(T)
    tempered.prepare(T)
    tau = torch.tensor([1.0] * 4 + [1 + 0.5 * math.log(2)] * 4 + [1 + 0.5 * math.log(3)] * 4)  # (T,)
    for layer in (0, 1):
        (pq, pk, _), (tq, tk, _) = encode(plain, q, k, ctx, layer), encode(tempered, q, k, ctx, layer)
        scaled = layer == 1 or layers == "all"
        torch.testing.assert_close(tq, pq * tau[:, None] if scaled else pq)
        assert torch.equal(tk, pk)


def test_a_model_with_temperature_is_unchanged_up_to_the_training_length():
    """Training never sees τ != 1: at T <= L the logits with and without temperature are equal;
    beyond L they differ."""
    args = ["encoding=rope_nope", "model.n_layer=2", "model.d_model=32", "model.n_head=4", "trainer.seq_len=16"]
    models = []
    for temperature in ("none", "log"):
        torch.manual_seed(0)
        models.append(build_model(compose([*args, f"encoding.temperature={temperature}"]), vocab_size=64).eval())
    idx = torch.randint(64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(models[0](idx[:, :16])[0], models[1](idx[:, :16])[0])
        long = [m(idx)[0] for m in models]
    torch.testing.assert_close(long[0][:, :16], long[1][:, :16])  # causal: positions < L unchanged
    assert not torch.allclose(long[0][:, 16:], long[1][:, 16:])
