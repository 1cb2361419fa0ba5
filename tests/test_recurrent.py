"""Recurrent layer kinds (posenc/nn/recurrence.py, nn/recurrent.py) and the hybrid layouts.

Properties from the papers and what a user relies on: the chunked form computes the recurrence
(S_t = α_t S_{t-1}(I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ for the gated delta rule, S_t = α_t S_{t-1} +
v_t k_tᵀ for scalar-decay GLA) in float64, and so do flash-linear-attention's own naive reference
recurrences; documents packing resets the state (a document after another is computed as alone);
a hybrid model is causal; RoPE inside a recurrent layer makes it relative (RoFormer §3.3);
windows and score-matrix encodings are refused on recurrent layers with one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fla_reference import fla_naive

from posenc.build import build_layout, build_model, restore_weights
from posenc.config import compose
from posenc.errors import UserError
from posenc.eval.probes import capture_inputs
from posenc.nn.chunkwise import unit_lower_solve
from posenc.nn.fla_kernels import cu_seqlens
from posenc.nn.recurrence import (
    chunked_gated_delta_rule,
    chunked_gla,
    recurrent_gated_delta_rule,
    recurrent_gla,
)
from posenc.record.statefile import load_state, save_state

B, H, T, DK, DV = 2, 2, 45, 8, 6
V = 64
# segments: the first row three documents (10 + 20 + 15 tokens), the second one
SEG = torch.tensor([[0] * 10 + [1] * 20 + [2] * 15, [0] * T])


def inputs(seed: int = 0):
    """q, k (unit keys, as the delta rule takes them), v, log decays g <= 0, β in (0, 1): float64."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, DK, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, H, T, DK, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, T, DV, generator=gen, dtype=torch.float64)
    g = -torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta


# --- the recurrences ---------------------------------------------------------------------
@pytest.mark.parametrize("seg", [None, SEG], ids=["one-document", "documents"])
@pytest.mark.parametrize("chunk", [16, 64])
def test_the_chunked_form_computes_the_recurrence(seg, chunk):
    """T = 45 is no multiple of either chunk, and documents start inside chunks."""
    q, k, v, g, beta = inputs()
    torch.testing.assert_close(chunked_gated_delta_rule(q, k, v, g, beta, seg, chunk),
                               recurrent_gated_delta_rule(q, k, v, g, beta, seg), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(chunked_gla(q, k, v, g, seg, chunk), recurrent_gla(q, k, v, g, seg),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rule", ["gated_delta", "gla"])
def test_the_chunked_forms_gradients_are_the_recurrences(rule):
    """The chunked form's hand-written backwards (posenc/nn/chunkwise.py) give autograd's
    gradients of the token-by-token definition, for every input, across documents and padding."""
    gen = torch.Generator().manual_seed(1)
    raw = [torch.randn(B, H, T, d, generator=gen, dtype=torch.float64, requires_grad=True) for d in (DK, DK, DV)]
    gates = [torch.randn(B, H, T, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    upstream = torch.randn(B, H, T, DV, generator=gen, dtype=torch.float64)

    def gradients(form):
        q, k, v = raw[0], F.normalize(raw[1], dim=-1), raw[2]
        g, beta = -F.softplus(gates[0]), torch.sigmoid(gates[1])
        if rule == "gla":
            out, wrt = form[1](q, k, v, g, SEG, **form[2]), [*raw, gates[0]]
        else:
            out, wrt = form[0](q, k, v, g, beta, SEG, **form[2]), [*raw, *gates]
        return torch.autograd.grad(out, wrt, upstream)

    chunked = gradients((chunked_gated_delta_rule, chunked_gla, {"chunk": 16}))
    for got, want in zip(chunked, gradients((recurrent_gated_delta_rule, recurrent_gla, {})), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("C", [5, 32, 45])
def test_the_unit_lower_solve_is_torchs_triangular_solve(C):
    """(I + tril₋₁ A)⁻¹ R by blocks of 8, merged (C = 45: a ragged last block), against LAPACK's
    unitriangular solve, gradients included; the upper part and diagonal of A are not read."""
    gen = torch.Generator().manual_seed(0)
    A = (0.3 * torch.randn(3, C, C, generator=gen, dtype=torch.float64)).requires_grad_()
    R = torch.randn(3, C, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, C, 4, generator=gen, dtype=torch.float64)
    got = unit_lower_solve(A, R)
    want = torch.linalg.solve_triangular(A.tril(-1) + torch.eye(C, dtype=A.dtype), R, upper=False, unitriangular=True)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for a, b in zip(torch.autograd.grad(got, (A, R), up), torch.autograd.grad(want, (A, R), up), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_delta_rule_with_beta_one_and_no_decay_overwrites_a_key():
    """β = 1, α = 1: writing v under unit key k replaces what S held under k (the delta rule), so
    reading with q = k returns the last value written, whatever came before."""
    q, k, v, _, _ = inputs()
    k[:, :, 5] = k[:, :, 2]  # the same key written at t = 2 and again at t = 5
    ones, zeros = torch.ones(B, H, T, dtype=torch.float64), torch.zeros(B, H, T, dtype=torch.float64)
    q[:, :, 5] = k[:, :, 5]
    o = chunked_gated_delta_rule(q, k, v, zeros, ones, chunk=4)
    torch.testing.assert_close(o[:, :, 5], v[:, :, 5])


def bthd(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, ...) <-> (B, T, H, ...), fla's layout."""
    return x.transpose(1, 2)


def test_the_gated_delta_rule_equals_flas_naive_recurrence():
    """fla computes its reference in float32: equal to that precision."""
    naive = fla_naive("gated_delta_rule/naive.py")
    q, k, v, g, beta = inputs(1)
    ref, _ = naive.naive_recurrent_gated_delta_rule(bthd(q), bthd(k), bthd(v), bthd(beta), bthd(g), scale=1.0)
    torch.testing.assert_close(chunked_gated_delta_rule(q, k, v, g, beta, chunk=16), bthd(ref).double(),
                               rtol=1e-5, atol=1e-5)


def test_scalar_decay_gla_equals_flas_naive_recurrence():
    naive = fla_naive("simple_gla/naive.py")
    q, k, v, g, _ = inputs(2)
    ref, _ = naive.naive_recurrent_simple_gla(bthd(q), bthd(k), bthd(v), bthd(g), scale=1.0)
    torch.testing.assert_close(chunked_gla(q, k, v, g, chunk=16), bthd(ref).double(), rtol=1e-5, atol=1e-5)


def test_cu_seqlens_marks_every_document_and_every_window():
    """fla's convention for packed sequences: offsets of each segment in the flattened batch."""
    assert cu_seqlens(SEG).tolist() == [0, 10, 30, 45, 90]


# --- hybrid models ------------------------------------------------------------------------
def model_of(*overrides: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = compose(["model.n_layer=4", "model.n_head=2", "model.d_model=32", "trainer.seq_len=32", *overrides])
    return build_model(cfg, vocab_size=V).double().eval()


ROPE_INSIDE = "layout.kinds.recurrent.encoding={_target_:posenc.nn.encodings.rope.RoPE,name:rope}"
# the three recurrences, a softmax layer with partial RoPE and with NoPE, and RoPE inside the recurrent layers
HYBRIDS = [["layout=qwen3_next"], ["layout=jamba_like"], ["layout=kimi_linear"], ["layout=hybrid", ROPE_INSIDE]]
IDS = ["qwen3_next", "jamba_like", "kimi_linear", "rope-inside"]


def tokens(seed: int = 0, length: int = 40) -> torch.Tensor:
    return torch.randint(V, (2, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("overrides", HYBRIDS, ids=IDS)
def test_a_hybrid_model_is_causal(overrides):
    """The logits at t do not change when token t + 1 changes (a chunk of 64 covers the window,
    so this checks the masks inside a chunk)."""
    model = model_of(*overrides)
    x = tokens()
    y = x.clone()
    y[:, 20] = (y[:, 20] + 1) % V
    with torch.no_grad():
        a, b = model(x)[0], model(y)[0]
    torch.testing.assert_close(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.parametrize("overrides", HYBRIDS, ids=IDS)
def test_a_packed_document_is_computed_as_the_document_alone(overrides):
    """Documents packing: the recurrent state and the short convolution restart at document B, so
    B after A gives B's logits as B alone (fla's cu_seqlens)."""
    model = model_of(*overrides)
    x = tokens(1)
    doc = torch.zeros_like(x)
    doc[:, 13:] = 1
    with torch.no_grad():
        packed = model(x, doc=doc)[0]
        alone = model(x[:, 13:])[0]
    torch.testing.assert_close(packed[:, 13:], alone)


def test_rope_inside_a_recurrent_layer_is_relative():
    """RoFormer §3.3 inside the recurrence: every product it forms is (R_i q_i)·(R_j k_j) =
    q_iᵀ R_{j-i} k_j or (R_i k_i)·(R_j k_j), so shifting every position by s changes nothing;
    without the shift-invariance the rotation would not be there at all (checked too)."""
    model = model_of("layout=hybrid", ROPE_INSIDE, "layout.pattern=[recurrent]")
    x = tokens(2)
    pos = torch.arange(x.shape[1])
    with torch.no_grad():
        base, shifted = model(x, pos=pos)[0], model(x, pos=pos + 7)[0]
        reversed_ = model(x, pos=pos.flip(0))[0]
    torch.testing.assert_close(base, shifted)
    assert not torch.allclose(base, reversed_)


def test_the_presets_are_the_models_they_are_named_after():
    qwen = model_of("layout=qwen3_next")
    assert [qwen.layout.mixer(layer) for layer in range(4)] == ["gated_delta"] * 3 + ["softmax"]
    assert qwen.encoding.for_layer(3).fraction == 0.25 and qwen.encoding.for_layer(0).name == "nope"
    kimi = model_of("layout=kimi_linear")
    assert {kimi.encoding.for_layer(layer).name for layer in range(4)} == {"nope"}
    jamba = model_of("layout=jamba_like", "model.n_layer=8")
    assert [jamba.layout.mixer(layer) for layer in range(8)] == ["gla"] * 4 + ["softmax"] + ["gla"] * 3
    assert qwen.layout.describe() == "recurrent (gated_delta) ×3, attention (global) ×1"


def test_a_window_on_a_recurrent_layer_is_refused():
    with pytest.raises(UserError, match=r"layout.kinds.recurrent is a gated_delta layer, which has no attention window"):
        build_layout(compose(["layout=hybrid", "layout.kinds.recurrent.window=8"]))


def test_an_encoding_that_needs_scores_is_refused_on_a_recurrent_layer():
    with pytest.raises(UserError, match="have no score matrix for encoding 'alibi'"):
        model_of("encoding=alibi", "layout=hybrid",
                 "layout.kinds.recurrent.encoding={_target_:posenc.nn.encodings.alibi.ALiBi,name:alibi}")
    model_of("encoding=alibi", "layout=hybrid")  # ALiBi on the softmax layers alone is a hybrid of the study


def test_probes_refuse_a_model_with_recurrent_layers():
    with pytest.raises(ValueError, match="attention probes need softmax attention in every layer"):
        capture_inputs(model_of("layout=hybrid"), tokens())


def test_a_recurrent_layer_learns_every_parameter():
    """One backward reaches every parameter of a hybrid, the decay and β projections, A_log, dt_bias
    and the convolution included (ordinary parameters: checkpoints and resume carry them)."""
    model = model_of("layout=qwen3_next").float().train()
    x = tokens(3)
    _, loss = model(x, x)
    loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []



def test_a_hybrid_checkpoint_restores_the_same_model(tmp_path: Path) -> None:
    """The recurrent layers' parameters (A_log, dt_bias, the convolution) are ordinary parameters:
    saved to a checkpoint file and loaded into a freshly built model, it computes the same logits
    (resume and `posenc eval` load checkpoints this way)."""
    model = model_of("layout=qwen3_next")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    save_state({"model": model.state_dict()}, tmp_path / "last.safetensors")
    fresh = model_of("layout=qwen3_next")
    restore_weights(fresh, load_state(tmp_path / "last.safetensors"), tmp_path / "last.safetensors")
    x = tokens(4)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x)[0], model(x)[0])


# --- CUDA -----------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flas_chunk_gated_delta_rule_is_the_chunked_form_on_cuda():
    """fla's chunk_gated_delta_rule, as the layer calls it (documents as cu_seqlens), against the
    chunked PyTorch form on the same GPU, values and gradients, at head_dim 64 and T = 1024 in bf16
    inputs; skipped where fla is not installed or refuses (its warning says why). A GPU's test alone:
    fla's chunked kernels do not run in Triton's interpreter (docs/gpu.md)."""
    from posenc.nn import fla_kernels
    from posenc.nn.kernels import KernelPolicy

    gen = torch.Generator().manual_seed(6)
    b, h, t, d = 2, 4, 1024, 64
    q = torch.randn(b, h, t, d, generator=gen) / 8
    k = F.normalize(torch.randn(b, h, t, d, generator=gen), dim=-1)
    v = torch.randn(b, h, t, d, generator=gen)
    g, beta = -torch.rand(b, h, t, generator=gen) * 0.1, torch.rand(b, h, t, generator=gen)
    q, k, v, g, beta = (x.cuda() for x in (q, k, v, g, beta))
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor([300, 500, 224]))[None].expand(2, -1).cuda()
    policy = KernelPolicy()
    kernel = fla_kernels.usable("gated_delta", q.bfloat16(), v.bfloat16(), policy)
    if kernel is None:
        pytest.skip("fla's chunk_gated_delta_rule is not usable here: "
                    f"{policy.fallbacks[-1].reason if policy.fallbacks else 'fla not installed'}")
    leaves = [x.bfloat16().requires_grad_() for x in (q, k, v)] + [g.requires_grad_(), beta.requires_grad_()]
    up = torch.randn(2, 4, 1024, 64, device="cuda")
    ours = chunked_gated_delta_rule(*leaves, seg)
    theirs = fla_kernels.mix(kernel, "gated_delta", *leaves, seg)
    torch.testing.assert_close(theirs.float(), ours.float(), rtol=2e-2, atol=2e-2)
    for a, e in zip(torch.autograd.grad(theirs, leaves, up.to(theirs.dtype)),
                    torch.autograd.grad(ours, leaves, up.to(ours.dtype)), strict=True):
        torch.testing.assert_close(a.float(), e.float(), rtol=5e-2, atol=5e-2)
