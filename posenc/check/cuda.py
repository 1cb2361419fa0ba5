"""On CUDA, what runs there, at the shapes users train: head_dim 64 and 128, T = 1024. For each
head_dim two rows:

- fp32 = float64 CPU: the model's own plans (FlexAttention, its kernel compiled, where the
  encoding offers it; SDPA otherwise) forward and backward in fp32 (TF32 off) on a window of
  three packed documents, against the same model in float64 on the CPU: the loss and every
  gradient within FP32_TOLERANCE, or within FP32_SLACK times the error of the CPU's own fp32;
- compiled bf16 training: ``STEPS`` steps of posenc's own TrainState and train_step (the step
  `posenc train` runs) compiled, under bf16 autocast, on one batch: the first loss within
  BF16_TOLERANCE of the float64 loss, every loss and gradient norm finite, the loss falling.

A kernel that does not compile at the shape (FlexAttention's tiles are bounded by the GPU's
shared memory, which grows with head_dim: T5's bias at head_dim 64 did not compile on an H200
while these rows ran at head_dim 16) fails the row with the compiler's reason, and so does a
fallback from FlexAttention announced while a row runs (a RuntimeWarning naming it): the row
would otherwise time another kernel than the one planned.

Two heads (d_model = 2·head_dim): a kernel's tiles and shared memory depend on head_dim, not on
the number of heads, and one batch row keeps the float64 reference near a second of one CPU core
per head_dim. The layers and the rest of the config are the subject's. Not offered without CUDA.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator

import torch
from omegaconf import DictConfig

from posenc.check.results import CheckResult, holds, not_offered, raised
from posenc.check.subject import Subject, seeded
from posenc.data.batches import Batch
from posenc.hardware import autocast_context
from posenc.nn.attention import FusedPlan, plans
from posenc.nn.flex import FlexPlan
from posenc.train.state import new_train_state, train_step

#: the head dimensions users train (GPT-2 small: 64; Llama and most 2024-25 models: 128)
HEAD_DIMS = (64, 128)
#: the sequence length of the CUDA rows (at least the subject's own)
SEQ_LEN = 1024
#: heads of the CUDA rows' model: the kernels' tiles depend on head_dim alone
HEADS = 2
#: compiled bf16 optimizer steps on the one batch
STEPS = 3
#: float32 on CUDA against float64 on the CPU: relative error of the loss and of the gradients
FP32_TOLERANCE = 1e-3
#: ... or at most this many times the error of the same model in fp32 on the CPU, where that is larger
FP32_SLACK = 4
#: bf16 autocast against float64: absolute difference of the losses, in nats
BF16_TOLERANCE = 0.05


def names(head_dim: int) -> tuple[str, str]:
    return (f"CUDA fp32 = float64 (head_dim {head_dim}, T {SEQ_LEN})",
            f"CUDA compiled bf16 (head_dim {head_dim}, T {SEQ_LEN})")


def cuda_checks(s: Subject) -> list[CheckResult]:
    """Both rows at each of HEAD_DIMS; a row whose code raises (a kernel that does not compile) is
    a ✗ of its own, so the others are still measured."""
    if not torch.cuda.is_available():
        return [not_offered(name, "no CUDA device") for d in HEAD_DIMS for name in names(d)]
    rows = []
    for head_dim in HEAD_DIMS:
        for name, row in zip(names(head_dim), (fp32_row, bf16_training_row), strict=True):
            try:
                rows.append(row(s, head_dim, name, torch.device("cuda")))
            except Exception as e:  # noqa: BLE001 - a kernel that fails to compile fails its row, with the reason
                rows.append(raised(name, e))
    return rows


def shaped(s: Subject, head_dim: int, **keys: object) -> DictConfig:
    """The subject's config at HEADS heads of head_dim, T = max(SEQ_LEN, the subject's), and keys."""
    return s.with_changes(**{"model.n_head": HEADS, "model.d_model": HEADS * head_dim,
                             "trainer.seq_len": max(SEQ_LEN, s.T), **keys})


def fp32_row(s: Subject, head_dim: int, name: str, device: torch.device) -> CheckResult:
    """The device's fp32 loss and gradients against float64, as close as the CPU's own fp32 gets
    (or FP32_TOLERANCE): at T = 1024 fp32 itself drifts past 1e-3 where positions are sums over
    the window (CoPE's gates), on any kernel."""
    cfg = shaped(s, head_dim)
    T = int(cfg.trainer.seq_len)
    cpu, gpu = models(s, cfg, device)
    x, y = s.tokens(7, batch=1, T=T), s.tokens(8, batch=1, T=T)
    doc = documents(T) if s.softmax else None
    want = loss_and_grads(cpu, x, y, doc)
    cpu32 = relative_error(loss_and_grads(cpu.float(), x, y, doc), want)
    x, y, doc = x.to(device), y.to(device), None if doc is None else doc.to(device)
    kernels = kernel_names(gpu, x, doc)
    with exact_fp32(), new_warnings() as caught:
        worst = relative_error(loss_and_grads(gpu, x, y, doc), want)
    fell = fallback(caught, kernels)
    ok = worst <= max(FP32_TOLERANCE, FP32_SLACK * cpu32) and fell is None
    return holds(name, ok, f"max relative error {worst:.1e} (CPU fp32 {cpu32:.1e}), {kernels}",
                 fell or "the kernels compute other attention or gradients than the CPU reference")


def relative_error(got: tuple[float, dict], want: tuple[float, dict]) -> float:
    """The largest relative error of the loss and of any parameter's gradient (Frobenius norm)."""
    (got_loss, got_grads), (want_loss, want_grads) = got, want
    worst = max(float((got_grads[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in want_grads.items())
    return max(worst, abs(got_loss - want_loss) / abs(want_loss))


def bf16_training_row(s: Subject, head_dim: int, name: str, device: torch.device) -> CheckResult:

    cfg = shaped(s, head_dim, **{"trainer.compile": True, "trainer.grad_accum": 1, "trainer.batch_size": 1,
                                 "trainer.max_steps": STEPS, "trainer.warmup_steps": 0})
    T = int(cfg.trainer.seq_len)
    cpu, gpu = models(s, cfg, device)
    batch = Batch(s.tokens(7, batch=1, T=T), s.tokens(8, batch=1, T=T))
    with torch.no_grad():
        want = float(cpu(batch.x, batch.y)[1])
    kernels = kernel_names(gpu, batch.x.to(device), None)
    state = new_train_state(gpu, cfg.trainer, OneBatch(batch), device, autocast_context("bf16", device))
    with new_warnings() as caught:
        steps = [train_step(state, [batch]) for _ in range(STEPS)]
        losses, norms = [float(r.loss) for r in steps], [float(r.grad_norm) for r in steps]
    finite = all(math.isfinite(v) for v in losses + norms)
    fell = fallback(caught, kernels)
    ok = finite and abs(losses[0] - want) <= BF16_TOLERANCE and losses[-1] < losses[0] and fell is None
    why = fell or ("a loss or gradient norm is not finite" if not finite else
                   "bf16 drifts from the float64 loss" if abs(losses[0] - want) > BF16_TOLERANCE else
                   f"the loss does not fall over {STEPS} steps on one batch")
    return holds(name, ok, f"losses {' '.join(f'{v:.3f}' for v in losses)} (float64 {want:.3f}), {kernels}", why)


def models(s: Subject, cfg: DictConfig, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The subject's model in float64 on the CPU and the same weights in float32 on the device, training mode."""
    cpu = s.model(cfg=cfg).train()
    gpu = s.model(cfg=cfg, dtype=torch.float32).train().to(device)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


def documents(T: int) -> torch.Tensor:
    """(1, T) ids of three packed documents: a quarter, a half and the rest of the window."""
    return torch.repeat_interleave(torch.arange(3), torch.tensor([T // 4, T // 2, T - T // 4 - T // 2]))[None]


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, doc: torch.Tensor | None):
    model.zero_grad(set_to_none=True)
    with seeded():  # the CPU reference and the device draw an encoding's random numbers alike (random positions)
        _, loss = model(x, y, doc=doc)
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().to("cpu", torch.float64, copy=True)
                                  for n, p in model.named_parameters() if p.grad is not None}


def kernel_names(model: torch.nn.Module, x: torch.Tensor, doc: torch.Tensor | None) -> str:
    """What each layer runs in this forward, as the model plans it: 'FlexAttention + gated_delta'.
    Planning here also says, once, why a layer leaves FlexAttention by design (before any row
    listens for a fallback)."""
    ctx = model.context(x, None, doc, x.shape[1])
    kinds = []
    for layer, plan in enumerate(plans(model.encoding, ctx, model.n_layer, 0.0, model.kernels)):
        mixer = model.layout.mixer(layer)
        linear = model.blocks[layer].attn.attention == "linear"
        kinds.append(mixer if mixer != "softmax" else "linear attention" if linear else
                     "FlexAttention" if isinstance(plan, FlexPlan) else "SDPA causal" if plan is None else
                     f"{plan.name}'s own kernel" if isinstance(plan, FusedPlan) else "SDPA explicit mask")
    return " + ".join(dict.fromkeys(kinds))


class OneBatch:
    """The batch source of the training row: the same batch every step."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def next(self) -> Batch:
        return self.batch


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls in full precision (no TF32), as the float64 comparison needs."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def new_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """The warnings issued inside, recorded; shown afterwards as they would have been."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def fallback(caught: list[warnings.WarningMessage], kernels: str) -> str | None:
    """The message of a fallback announced while a row ran whose plan was FlexAttention (a kernel that
    did not compile) or an encoding's own kernel (flash-linear-attention refusing when it ran), or None."""
    for planned, said in (("FlexAttention", "FlexAttention"), ("own kernel", "flash-linear-attention")):
        if planned in kernels:
            fell = next((f"planned {planned}, fell back: {w.message}"[:300] for w in caught
                         if issubclass(w.category, RuntimeWarning) and said in str(w.message)), None)
            if fell is not None:
                return fell
    return None
