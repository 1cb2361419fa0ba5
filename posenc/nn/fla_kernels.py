"""flash-linear-attention's chunked Triton kernels for the recurrent layer kinds, where fla's kernels
run (posenc/nn/fla_runtime.py: CUDA, or a CPU under Triton's interpreter).

Optional (``pip install posenc[fla]``): elsewhere the recurrent layers use the chunked PyTorch form
(posenc/nn/recurrence.py), which computes the same thing and is the designed path there. Under
Triton's interpreter fla 0.6's chunked kernels do not run (the interpreter gives a kernel's loop
counter as a Python int, on which fla's ``i_t.to(tl.int64)`` fails: docs/gpu.md), so there the first
use refuses them with one warning and the run takes the chunked form, as below. fla takes
(B, T, H, d) tensors and, for packed documents, one flattened sequence with ``cu_seqlens`` (the
offsets where each document starts): the same reset of the state at every document.

fla can refuse in two places, and either way the layers take the chunked PyTorch form for the rest
of the run, recorded in the run's policy (posenc/nn/kernels.py) with one warning that names the
error, never a crash:

- at import: fla not installed, or its Triton missing or not matching torch (an ImportError, or
  whatever fla's import raises);
- at call time, in the backward: fla-core 0.6 refuses ``RuntimeError: Triton >= 3.4.0 and < 3.7.1
  on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg (see #640)``
  (fla/ops/common/chunk_o.py, unless tilelang is installed), which the backwards of
  ``chunk_gated_delta_rule`` and ``chunk_simple_gla`` call. Their forwards succeed: the error would
  surface in the first ``loss.backward()``, far from the layer.

So before its first use with a dtype and head sizes, each kernel runs once forwards and backwards
on a small input of two documents (the ``cu_seqlens`` path), outside any compiled graph; any
exception there is fla's refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from posenc.nn import failures
from posenc.nn.fla_runtime import fla_device, import_fla

if TYPE_CHECKING:
    from posenc.nn.kernels import KernelPolicy

#: each recurrent mixer's kernel: (module, function)
KERNELS: dict[str, tuple[str, str]] = {
    "gated_delta": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
    "kda": ("fla.ops.kda", "chunk_kda"),
}
#: the kernels imported in this process (mixer -> function): a dict lookup in the forward, which
#: torch.compile traces; which of them a run may use is the run's (``KernelPolicy.fla_refused`` and
#: ``fla_passed``: the first uses that ran forwards and backwards, by mixer, device, dtype, d_k, d_v)
_imported: dict[str, Callable] = {}


def usable(rule: str, q: Tensor, v: Tensor, policy: KernelPolicy) -> bool:
    """Whether fla's kernel for ``rule`` computes this call: a device fla runs on (``fla_device``), and
    the kernel imported and run once forwards and backwards at this dtype and head sizes in this run
    (one warning if not)."""
    if not fla_device(q.device) or policy.fla_is_refused(rule):
        return False
    if (rule, q.device.type, q.dtype, q.shape[-1], v.shape[-1]) not in policy.fla_passed:
        return _first_use(rule, q, v, policy)
    return True


def path(rule: str, device_type: str, policy: KernelPolicy) -> str:
    """The path a recurrence of ``rule`` takes on device_type in this run, as the run's record names it
    (posenc/nn/kernels.py): fla's kernel once its first use passed here, else the chunked form."""
    if fla_device(device_type) and not policy.fla_is_refused(rule) \
            and any(p[0] == rule and p[1] == device_type for p in policy.fla_passed):
        return f"fla:{KERNELS[rule][1]}"
    return "chunked"


@torch.compiler.disable
def _first_use(rule: str, q: Tensor, v: Tensor, policy: KernelPolicy) -> bool:
    """Import the kernel and run it on a small input (gradients on, whatever the caller's mode);
    record what happened in the run's policy. Eager even inside a compiled forward."""
    try:
        kernel = _kernel(rule)
        with torch.inference_mode(False), torch.enable_grad():
            *inputs, seg = _trial_inputs(rule, q.device, q.dtype, q.shape[-1], v.shape[-1])
            out = _call(kernel, rule, *inputs, seg)
            grads = torch.autograd.grad(out.sum(), [t for t in inputs if t is not None])
            float(sum(g.float().sum() for g in grads))  # waits for the kernels: their errors surface here
    except Exception as error:  # noqa: BLE001 - whatever fla raises, the chunked form computes the same thing
        reason = failures.first_line(error)
        hint = " (pip install 'posenc[fla]')" if isinstance(error, ImportError) else ""
        policy.refuse_recurrent(rule, KERNELS[rule][1], reason,
                                f"flash-linear-attention's {KERNELS[rule][1]} is not usable on {q.device.type} ({reason}): "
                                f"the {rule} layers use the chunked PyTorch recurrence for the rest of this run{hint}")
        return False
    policy.fla_passed.add((rule, q.device.type, q.dtype, q.shape[-1], v.shape[-1]))
    return True


def _kernel(rule: str) -> Callable:
    if rule not in _imported:
        module, name = KERNELS[rule]
        _imported[rule] = getattr(import_fla(module), name)
    return _imported[rule]


def _trial_inputs(rule: str, device: torch.device, dtype: torch.dtype, dk: int, dv: int) -> list:
    """q, k, v, g, beta, seg for one row of two documents (40 + 60 tokens: a chunk boundary
    inside the second), leaves that need gradients; drawn from a generator of their own, so the
    caller's random stream is untouched."""
    gen = torch.Generator().manual_seed(0)
    T, H = 100, 1

    def leaf(*shape: int, scale: float = 1.0, shift: float = 0.0) -> Tensor:
        return (torch.rand(*shape, generator=gen) * scale + shift).to(device, dtype).requires_grad_()

    q, k, v = leaf(1, H, T, dk, shift=-0.5), leaf(1, H, T, dk, shift=-0.5), leaf(1, H, T, dv, shift=-0.5)
    g = leaf(1, H, T, *((dk,) if rule == "kda" else ()), scale=-0.1)  # log decays in (-0.1, 0]
    beta = leaf(1, H, T) if rule != "gla" else None
    seg = torch.tensor([[0] * 40 + [1] * (T - 40)], device=device)
    return [q, k, v, g, beta, seg]


def cu_seqlens(seg: Tensor) -> Tensor:
    """seg (B, T) segment ids -> the offsets of every segment of the flattened (1, B·T) sequence,
    ending with B·T (fla's convention); every window starts a segment too."""
    B, T = seg.shape
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    offsets = starts.flatten().nonzero().flatten()
    return torch.cat((offsets, offsets.new_tensor([B * T]))).to(torch.int32 if B * T < 2**31 else torch.int64)


def mix(rule: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, seg: Tensor | None) -> Tensor:
    """The recurrence through fla (after ``usable``): q, k (B, H, T, dk) (q already scaled),
    v (B, H, T, dv), g (B, H, T) (kda: (B, H, T, dk)), beta (B, H, T) -> (B, H, T, dv)."""
    return _call(_imported[rule], rule, q, k, v, g, beta, seg)


def _call(kernel: Callable, rule: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None,
          seg: Tensor | None) -> Tensor:
    B, H, T, _ = q.shape
    q, k, v, g = (t.transpose(1, 2) for t in (q, k, v, g))  # (B, T, H, ...)
    g = g.float()
    offsets = None
    if seg is not None:  # documents: one flattened sequence, the state reset at each offset
        q, k, v, g = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, g))
        offsets = cu_seqlens(seg)
    if beta is None:
        o, _ = kernel(q, k, v, g, scale=1.0, cu_seqlens=offsets)
    else:
        o, _ = kernel(q, k, v, g, beta.transpose(1, 2).reshape(q.shape[:3]).to(q.dtype), scale=1.0, cu_seqlens=offsets)
    return o.reshape(B, T, H, -1).transpose(1, 2)
