"""On CUDA, what runs there: the model's own plans (FlexAttention, compiled, where the encoding
offers it; SDPA otherwise) forward and backward against the same model in float64 on the CPU, and
a bf16 autocast step that stays finite and near float32's loss. Skipped without CUDA.

head_dim 16 here (d_model 64, 4 heads): FlexAttention's kernels need at least 16, below which
posenc falls back to SDPA and the kernel would go untested.
"""

from __future__ import annotations

import math

import torch

from posenc.check.results import CheckResult, holds, not_offered
from posenc.check.subject import Subject

#: float32 on CUDA against float64 on the CPU: relative error of the loss and of the gradients
FP32_TOLERANCE = 1e-3
#: bf16 autocast against float32: absolute difference of the losses, in nats
BF16_TOLERANCE = 0.05

NAMES = ("CUDA forward+backward = float64 CPU", "CUDA bf16 autocast step")


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, doc: torch.Tensor | None):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y, doc=doc)
    loss.backward()
    return float(loss), {n: p.grad.detach().double().cpu() for n, p in model.named_parameters() if p.grad is not None}


def cuda_checks(s: Subject) -> list[CheckResult]:
    if not torch.cuda.is_available():
        return [not_offered(name, "no CUDA device") for name in NAMES]
    cfg = s.with_changes(**{"model.d_model": 64})
    cpu = s.model(cfg=cfg).train()
    gpu = s.model(cfg=cfg, dtype=torch.float32).train().cuda()
    gpu.load_state_dict(cpu.state_dict())
    x, y = s.tokens(7), s.tokens(8)
    doc = s.documents() if s.softmax else None
    want_loss, want = loss_and_grads(cpu, x, y, doc)
    got_loss, got = loss_and_grads(gpu, x.cuda(), y.cuda(), None if doc is None else doc.cuda())
    worst = max(float((got[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in want.items())
    worst = max(worst, abs(got_loss - want_loss) / abs(want_loss))
    rows = [holds(NAMES[0], worst <= FP32_TOLERANCE, f"max relative error {worst:.1e}",
                  "the CUDA kernels compute other attention or gradients than the CPU reference")]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16_loss, grads = loss_and_grads(gpu, x.cuda(), y.cuda(), None if doc is None else doc.cuda())
    finite = math.isfinite(bf16_loss) and all(torch.isfinite(g).all() for g in grads.values())
    gap = abs(bf16_loss - got_loss)
    rows.append(holds(NAMES[1], finite and gap <= BF16_TOLERANCE, f"loss {bf16_loss:.3f} vs fp32 {got_loss:.3f}",
                      "bf16 gives a loss or gradient that is not finite" if not finite else "bf16 drifts from fp32"))
    return rows
