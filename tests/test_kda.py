"""Kimi Delta Attention (posenc/nn/kda.py) and the kimi_linear layout.

Properties from the paper and what a user relies on: the chunked form computes the recurrence
S_t = S_{t-1} diag(α_t) (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ (one decay per key channel) in float64,
values and gradients; it is flash-linear-attention's naive KDA (recurrent and chunked); documents
packing resets the state (each document computed as alone, as fla's cu_seqlens; the layer's
causality and documents: tests/test_recurrent.py's hybrids); it stays finite
and exact at a user's head size and length under decays from 0.01 to 100 per token; and
`layout=kimi_linear` is 3 KDA : 1 softmax layer with NoPE that trains, evaluates and resumes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, run_cli, run_dirs
from fla_reference import fla_naive, varlen

from posenc.build import build_model
from posenc.config import compose
from posenc.nn import fla_kernels
from posenc.nn.kernels import KernelPolicy
from posenc.nn.fla_kernels import cu_seqlens
from posenc.nn.kda import chunked_kda, recurrent_kda

B, H, T, DK, DV = 2, 2, 45, 8, 6
# segments: the first row three documents (10 + 20 + 15 tokens), the second one
SEG = torch.tensor([[0] * 10 + [1] * 20 + [2] * 15, [0] * T])


def inputs(seed: int = 0, shape: tuple[int, int, int, int, int] = (B, H, T, DK, DV), dtype=torch.float64):
    """q, unit k, v, per-channel log decays g <= 0, β in (0, 1)."""
    b, h, t, dk, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, dk, generator=gen, dtype=dtype)
    k = F.normalize(torch.randn(b, h, t, dk, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(b, h, t, dv, generator=gen, dtype=dtype)
    g = -torch.rand(b, h, t, dk, generator=gen, dtype=dtype)
    beta = torch.rand(b, h, t, generator=gen, dtype=dtype)
    return q, k, v, g, beta


def bthd(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, ...) <-> (B, T, H, ...), fla's layout."""
    return x.transpose(1, 2)


# --- the recurrence -------------------------------------------------------------------------
@pytest.mark.parametrize("seg", [None, SEG], ids=["one-document", "documents"])
@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_the_chunked_form_computes_the_recurrence(seg, chunk):
    """T = 45 is no multiple of any chunk, and documents start inside chunks and blocks."""
    q, k, v, g, beta = inputs()
    torch.testing.assert_close(chunked_kda(q, k, v, g, beta, seg, chunk), recurrent_kda(q, k, v, g, beta, seg),
                               rtol=1e-10, atol=1e-10)


def test_the_chunked_forms_gradients_are_the_recurrences():
    """Every input's gradient, the per-channel decays' included, across documents and padding."""
    gen = torch.Generator().manual_seed(1)
    raw = [torch.randn(B, H, T, d, generator=gen, dtype=torch.float64, requires_grad=True) for d in (DK, DK, DV, DK)]
    b_raw = torch.randn(B, H, T, generator=gen, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(B, H, T, DV, generator=gen, dtype=torch.float64)

    def gradients(form, **kw):
        q, k, v, g = raw[0], F.normalize(raw[1], dim=-1), raw[2], -F.softplus(raw[3])
        return torch.autograd.grad(form(q, k, v, g, torch.sigmoid(b_raw), SEG, **kw), [*raw, b_raw], upstream)

    for got, want in zip(gradients(chunked_kda, chunk=16), gradients(recurrent_kda), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_kda_is_flas_naive_recurrence_and_chunked_form_values_and_gradients():
    """fla computes its references in float32 (so to 1e-5): the token-by-token one with documents
    (fla's cu_seqlens, each document run alone), its chunked one (chunks of 64, T a multiple)."""
    naive = fla_naive("kda/naive.py")
    q, k, v, g, beta = (t.requires_grad_() for t in inputs(2))
    kernel = varlen(lambda q, k, v, g, beta, scale: naive.naive_recurrent_kda(q, k, v, g, beta, scale=scale)[0])
    flat = [bthd(t).reshape(1, B * T, *t.shape[1:2], *t.shape[3:]) for t in (q, k, v, g, beta)]  # one packed row
    ref = bthd(kernel(*flat, scale=1.0, cu_seqlens=cu_seqlens(SEG))[0].reshape(B, T, H, DV))
    ours = chunked_kda(q, k, v, g, beta, SEG, chunk=16)
    torch.testing.assert_close(ours, ref.double(), rtol=1e-5, atol=1e-5)
    up = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v, g, beta), up), torch.autograd.grad(ref, (q, k, v, g, beta), up),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    q, k, v, g, beta = inputs(3, (B, H, 128, DK, DV))
    ref, _ = naive.naive_chunk_kda(*(bthd(t) for t in (q, k, v, g, beta)), scale=1.0, chunk_size=64)
    torch.testing.assert_close(chunked_kda(q, k, v, g, beta), bthd(ref).double(), rtol=1e-5, atol=1e-5)


def test_at_a_users_shape_strong_decays_stay_finite_and_exact():
    """head_dim 64, T = 1024, float32, channels decaying by e^-0.01 to e^-100 per token: no
    exponential of a positive number is formed (in float64 too it would overflow, to nan), so the
    float32 chunked form is the float64 one, and on its first 128 tokens the definition."""
    q, k, v, g, beta = inputs(4, (1, 1, 1024, 64, 64), torch.float32)
    g = g * torch.tensor([0.01, 1.0, 10.0, 100.0]).repeat(16)
    got = chunked_kda(q / 8, k, v, g, beta)
    exact = [t.double() for t in (q / 8, k, v, g, beta)]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), chunked_kda(*exact), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[:, :, :128].double(), recurrent_kda(*(t[:, :, :128] for t in exact)),
                               rtol=1e-4, atol=1e-4)


def test_a_scalar_decay_per_head_is_the_gated_delta_rule():
    """KDA with every channel's decay equal is Gated DeltaNet."""
    from posenc.nn.recurrence import chunked_gated_delta_rule

    q, k, v, g, beta = inputs(5)
    torch.testing.assert_close(chunked_kda(q, k, v, g[..., :1].expand_as(g), beta, SEG),
                               chunked_gated_delta_rule(q, k, v, g[..., 0], beta, SEG), rtol=1e-10, atol=1e-10)


# --- the layer and the layout ---------------------------------------------------------------
def kimi(*overrides: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = compose(["model.n_layer=4", "model.n_head=2", "model.d_model=32", "trainer.seq_len=32", "layout=kimi_linear",
                   *overrides])
    return build_model(cfg, vocab_size=64)


def test_kimi_linear_is_three_kda_layers_to_one_softmax_layer_with_nope():
    model = kimi()
    assert [model.layout.mixer(layer) for layer in range(4)] == ["kda"] * 3 + ["softmax"]
    assert {model.encoding.for_layer(layer).name for layer in range(4)} == {"nope"}
    assert model.layout.describe() == "recurrent (kda) ×3, attention (global) ×1"
    mixer = model.blocks[0].attn
    assert mixer.dt_bias.shape == (32,) and mixer.A_log.shape == (2,)  # a decay bias per key channel, A per head


def test_a_kda_layer_learns_every_parameter():
    """One backward reaches every parameter, the low-rank decay and gate projections included."""
    model = kimi()
    x = torch.randint(64, (2, 40), generator=torch.Generator().manual_seed(3))
    model(x, x)[1].backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []


def test_kimi_linear_trains_evaluates_and_resumes_on_cpu(tmp_path: Path):
    """A 2-layer model (KDA, softmax) trains 2 steps, is extended to 3 by resuming from its
    checkpoint, and is evaluated by `posenc eval`."""
    args = [*TINY, "model.n_layer=2", "layout=kimi_linear", "trainer.max_steps=2"]
    assert (result := run_cli("train", *args, cwd=tmp_path)).returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(tmp_path)
    resumed = run_cli("train", f"trainer.resume={run_dir}", "trainer.max_steps=3", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(torch.isfinite(torch.tensor(r["train/loss"])) for r in rows)
    assert "resumed at step 2" in (run_dir / "train.log").read_text()
    evaluated = run_cli("eval", str(run_dir), "eval.lengths=[1]", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "ppl" in evaluated.stdout


# --- CUDA -----------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flas_chunk_kda_is_the_chunked_form_on_cuda():
    """fla's chunk_kda, as the layer calls it (documents as cu_seqlens), against the chunked
    PyTorch form on the same GPU, values and gradients, at head_dim 64 and T = 1024 in bf16 inputs;
    skipped where fla is not installed or refuses (its warning says why)."""
    q, k, v, g, beta = (t.cuda() for t in inputs(6, (2, 4, 1024, 64, 64), torch.float32))
    q, g = q / 8, g * 0.1
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor([300, 500, 224]))[None].expand(2, -1).cuda()
    policy = KernelPolicy()
    kernel = fla_kernels.usable("kda", q.bfloat16(), v.bfloat16(), policy)
    if kernel is None:
        pytest.skip(f"fla's chunk_kda is not usable here: "
                    f"{policy.fallbacks[-1].reason if policy.fallbacks else 'fla not installed'}")
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)] + [g.requires_grad_(), beta.requires_grad_()]
    up = torch.randn(2, 4, 1024, 64, device="cuda")
    ours = chunked_kda(*leaves, seg)
    theirs = fla_kernels.mix(kernel, "kda", *leaves, seg)
    torch.testing.assert_close(theirs.float(), ours.float(), rtol=2e-2, atol=2e-2)
    for a, b in zip(torch.autograd.grad(theirs, leaves, up.to(theirs.dtype)), torch.autograd.grad(ours, leaves, up.to(ours.dtype)),
                    strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2)
