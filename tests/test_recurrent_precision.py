"""Recurrent layers under bf16 autocast (``trainer.precision=bf16``): the recurrence is computed in
float32, as fla computes it, whatever autocast would do to its matmuls, and every layout with a
recurrent layer trains. On a CPU, ``torch.autocast("cpu", torch.bfloat16)`` is the same machinery
as on CUDA (it lowers the same ops: matmul, bmm, baddbmm, vecdot)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc.build import build_layout, build_model
from posenc.config import compose
from posenc.config.searchpath import group_options
from posenc.nn.kda import chunked_kda
from posenc.nn.recurrence import chunked_gated_delta_rule, chunked_gla

BF16 = torch.autocast("cpu", torch.bfloat16)


def recurrent_layouts() -> list[str]:
    """Every shipped layout with at least one recurrent layer kind, read from the configs."""
    return [name for name in group_options("layout") if build_layout(compose([f"layout={name}"])).recurrent]


def test_the_layouts_with_recurrent_layers_are_found():
    assert {"qwen3_next", "kimi_linear", "hybrid", "jamba_like"} <= set(recurrent_layouts())


@pytest.mark.parametrize("layout", recurrent_layouts())
def test_every_recurrent_layout_trains_under_bf16_autocast(layout):
    """A few AdamW steps on one repeated batch under CPU bf16 autocast: finite losses that fall
    (the logits come out in bf16: autocast is on)."""
    torch.manual_seed(0)
    cfg = compose([f"layout={layout}", "model.n_layer=2", "model.n_head=2", "model.d_model=32", "trainer.seq_len=64"])
    model = build_model(cfg, vocab_size=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(64, (2, 65), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(5):
        with BF16:
            logits, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert logits.dtype == torch.bfloat16
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.1, losses


def inputs(B: int = 1, H: int = 1, T: int = 1024, D: int = 64) -> tuple[torch.Tensor, ...]:
    """q (scaled), unit k, v, log decays, β at a user's head size and length, float32."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen) / D**0.5
    k = F.normalize(torch.randn(B, H, T, D, generator=gen), dim=-1)
    v = torch.randn(B, H, T, D, generator=gen)
    g = -0.1 * torch.rand(B, H, T, generator=gen)
    beta = torch.rand(B, H, T, generator=gen)
    return q, k, v, g, beta


#: each rule's chunked form, called on (q, k, v, g, beta, seg)
CHUNKED = {
    "gated_delta": chunked_gated_delta_rule,
    "gla": lambda q, k, v, g, beta, seg: chunked_gla(q, k, v, g, seg),
    "kda": lambda q, k, v, g, beta, seg: chunked_kda(q, k, v, g[..., None].expand_as(k) * torch.linspace(0.1, 2, 64), beta, seg),
}
#: three documents in a row of 1024 tokens, starting inside chunks
SEG = torch.repeat_interleave(torch.arange(3), torch.tensor([300, 500, 224]))[None]


@pytest.mark.parametrize("rule", sorted(CHUNKED))
def test_the_chunked_form_under_autocast_is_the_float32_form(rule):
    """float32 inputs: autocast changes nothing, values or gradients (no matmul of the recurrence
    is lowered to bf16). bf16 inputs (what autocast hands a layer): a bf16 output, the float32
    recurrence of those inputs rounded once."""
    form = CHUNKED[rule]
    leaves = [t.requires_grad_() for t in inputs()]
    used = leaves if rule != "gla" else leaves[:4]  # GLA has no β
    up = torch.randn(1, 1, 1024, 64, generator=torch.Generator().manual_seed(1))
    want = form(*leaves, SEG)
    want_grads = torch.autograd.grad(want, used, up)
    with BF16:
        got = form(*leaves, SEG)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for a, b in zip(torch.autograd.grad(got, used, up), want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    low = [t.detach().bfloat16() for t in leaves]
    with BF16:
        got = form(*low, SEG)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, form(*(t.float() for t in low), SEG).bfloat16(), rtol=1.6e-2, atol=1e-2)
