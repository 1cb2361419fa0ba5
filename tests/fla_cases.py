"""The encodings, inputs and layer that the tests of fla's attention kernels share
(tests/test_fla_attention.py with fla's naive references, tests/test_fla_interpreter.py with its
Triton kernels under Triton's interpreter): the five encodings with a kernel of fla's at head_dim 64,
their parameters moved from their initial values, random documents, and one layer's attention and
its gradients through the plan attention takes."""

from __future__ import annotations

import functools

import torch

from posenc.build import build_encoding
from posenc.config import compose
from posenc.nn import attention
from posenc.nn.encodings.base import Context
from posenc.nn.kernels import KernelPolicy
from posenc.nn.mask import AttentionMask, Window

FUSED = ["fox", "fox_rope", "path", "path_fox", "stick_breaking"]
B, H, HD = 2, 2, 64
SHAPE = ["model.n_layer=2", f"model.n_head={H}", f"model.d_model={H * HD}", "trainer.seq_len=1024"]


@functools.cache
def config(name: str):
    return compose([f"encoding={name}", *SHAPE])


def encoding_of(name: str, dtype: torch.dtype = torch.float64, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    encoding = build_encoding(config(name)).to(device, torch.float64)
    with torch.no_grad():
        for p in encoding.parameters():  # gates and transforms away from their initial values
            p.add_(torch.randn_like(p) * 0.1)
        if hasattr(encoding, "gate_bias"):  # forget gates near σ(4) ≈ 0.98, where trained FoX's are:
            encoding.gate_bias.add_(0.5)  # keys hundreds of tokens back still count (and windows matter)
    return encoding.to(dtype)  # drawn in float64 whatever the dtype: the same parameters in each


def segments_of(T: int, seed: int, batch: int = B) -> torch.Tensor:
    """(batch, T) document ids: a few runs of random length per row."""
    g = torch.Generator().manual_seed(seed)
    cuts = [sorted(torch.randperm(T - 1, generator=g)[:3].add(1).tolist()) for _ in range(batch)]
    return torch.stack([torch.bucketize(torch.arange(T), torch.tensor(c), right=True) for c in cuts])


def context(T: int, doc: torch.Tensor | None, window: Window, dtype: torch.dtype, device: str = "cpu") -> Context:
    doc = None if doc is None else doc.to(device)
    return Context.arange(T, device, dtype, doc, (AttentionMask(T, doc, window),) * 2)


def inputs(T: int, seed: int, dtype: torch.dtype = torch.float64, device: str = "cpu", batch: int = B):
    """q, k, v (batch, H, T, HD) requiring grad and the block's input x (batch, T, H·HD): drawn in
    float64 whatever the dtype."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, H, T, HD, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
               for _ in range(3))
    x = torch.randn(batch, T, H * HD, generator=g, dtype=torch.float64).to(device, dtype)
    return q, k, v, x


def layer_and_grads(encoding, ctx: Context, q, k, v, x, layer: int = 1, policy: KernelPolicy | None = None):
    """The layer's attention through the plan ctx gives (recorded in policy, as a model's forward
    records it), and the gradients of a fixed projection of it with respect to q, k, v and every
    parameter of the encoding."""
    encoding.prepare(ctx.T)  # RoPE's table, as the model asks once per forward
    chosen = attention.plans(encoding, ctx, layer + 1, 0.0, policy or KernelPolicy(), layers=[layer])[layer]
    out = attention.attend_layer(q, k, v, encoding, ctx.with_input(x), layer, chosen)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(out)
    wrt = [q, k, v, *encoding.parameters()]
    grads = torch.autograd.grad((out * probe).sum(), wrt, allow_unused=True)
    return chosen, out, [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, grads)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    """|actual - expected| <= tolerance · max |expected|, everywhere."""
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=tolerance * expected.abs().max().item(),
                               rtol=0, msg=what)
