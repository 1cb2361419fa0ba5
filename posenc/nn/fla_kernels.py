"""flash-linear-attention (fla) as posenc calls it: where its Triton kernels run, importing them, the
recurrent layer kinds' chunked kernels, and the attention kernels the mechanisms offer, with the adapters
that feed them posenc's definitions. Optional (``pip install 'posenc[fla]'``).

**Where they run.** On CUDA, and on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` in the
environment when Triton is imported: each ``@triton.jit`` kernel is then executed by numpy, one program
instance at a time). Both run the same kernels through the same adapters: the interpreter is how a CPU
machine tests the code a GPU run depends on, and a tiny run trains through it (slowly: seconds per kernel
call at T = 64). What the interpreter cannot show is the GPU's: shared memory and register limits (a
configuration too large for a GPU runs), Hopper's refusals (fla tests the GPU's name), bf16 and TF32
arithmetic, races between program instances (docs/gpu.md). Triton's autotuner times each of a kernel's
configurations through the GPU driver before the first call (``RuntimeError: 0 active drivers`` under the
interpreter, which has none); ``import_fla`` leaves each of fla's autotuned kernels its first
configuration under the interpreter, so nothing is timed (fla's own autotuner subclasses Triton's
``Autotuner``). An fla module is imported once per process, as any module is (``sys.modules``).

**The recurrent layer kinds** (gated delta rule, KDA, scalar-decay GLA: posenc/nn/recurrent.py) run fla's
chunked kernels where they run; elsewhere the chunked PyTorch form (posenc/nn/recurrence.py), which
computes the same thing and is the designed path there. Under Triton's interpreter fla 0.6's chunked
kernels do not run (the interpreter gives a kernel's loop counter as a Python int, on which fla's
``i_t.to(tl.int64)`` fails: docs/gpu.md), so there the first use refuses them. fla takes (B, T, H, d)
tensors and, for packed documents, one flattened sequence with ``cu_seqlens`` (the offsets where each
document starts): the same reset of the state at every document. fla can refuse at import (not installed,
its Triton missing or not matching torch) or at call time, in the backward: fla-core 0.6 refuses
``RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated
chunk_bwd_dqkwg (see #640)`` (fla/ops/common/chunk_o.py, unless tilelang is installed), which the backwards
of ``chunk_gated_delta_rule`` and ``chunk_simple_gla`` call; their forwards succeed, so the error would
surface in the first ``loss.backward()``, far from the layer. So before its first use with a dtype and head
sizes, each kernel runs once forwards and backwards on a small input of two documents (the ``cu_seqlens``
path), outside any compiled graph; any exception there is fla refusing, and the run's policy
(posenc/nn/kernels.py) refuses the kernel for the rest of the run, recorded, with one warning that names
the error: the layers take the chunked PyTorch form, never a crash.

**The attention kernels**: FoX (``parallel_forgetting_attn``), PaTH and PaTH-FoX (``parallel_path_attn``),
stick-breaking (``parallel_stickbreaking_attn``). Each computes a layer's whole attention block by block,
never writing its logits out; the encodings offer them through the contract's ``fused_attention`` hook
(posenc/nn/encodings/base.py), and attention takes them as a ``FusedPlan`` (posenc/nn/attention.py). The
adapters (``forgetting_attention``, ``path_attention``, ``stick_breaking_attention``) are where posenc's
definitions meet fla's arguments: (B, H, T, d) to fla's (B, T, H, d); documents, and a chunked window's
chunks, as segments of one flattened sequence (``cu_seqlens``, no key seen across one); a sliding window as
fla's ``window_size`` where the kernel takes one; gates and remainders as posenc defines them (each adapter
says how). tests/test_fla_attention.py runs them with fla's naive references, tests/test_fla_interpreter.py
with fla's Triton kernels under the interpreter, against posenc's own path. On a CPU without the
interpreter the encodings' hooks are the design (no kernel is offered, silently); where fla's kernels run, a
kernel that cannot be taken raises ``KernelUnavailable`` naming why (fla absent or refusing at import, a
dtype, head dim or sliding window it does not take), which the run's policy refuses, records and says once.
At call time only fla's own refusal counts as fla refusing: the adapters call fla's op through
``guarded``, which turns what fla raises to refuse (``failures.refuses``: a RuntimeError of fla's own
``raise``, a Triton error building the kernel) into ``KernelUnavailable``; anything else is raised as it
is: an error of posenc's own code around the call (the reshapes of ``to_fla``, the gates), and what fla or
torch raise about the arguments posenc passed (a shape, a layout, a dtype: fla's assertions and
ValueErrors), a bug to see, never a permanent O(T²) path blamed on fla. A refusal inside a kernel's
backward reaches the policy through the train step (posenc/train/state.py).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

import torch
from torch import Tensor

from posenc.nn import failures, torch_private
from posenc.nn.context import Context, FusedAttention
from posenc.nn.failures import KernelUnavailable
from posenc.nn.kernels import KernelPolicy, Running
from posenc.nn.mask import AttentionMask

#: the values of TRITON_INTERPRET Triton reads as on (triton/knobs.py's ``env_bool``, libtriton's getenv_bool)
ON = ("1", "true", "on", "yes", "y")


def interpreting() -> bool:
    """Whether Triton's interpreter is asked for in this process (TRITON_INTERPRET, read as Triton reads
    it; Triton decides when a kernel is defined, so this is the environment fla was imported under)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ON


def fla_device(device: torch.device | str) -> bool:
    """Whether fla's kernels are tried on ``device``: CUDA, or the CPU under Triton's interpreter.
    Where triton or fla is then missing, importing the kernel says so (one warning per run)."""
    kind = torch.device(device).type
    return kind == "cuda" or (kind == "cpu" and interpreting())


def import_fla(module: str) -> ModuleType:
    """fla's module ``module`` (``fla.ops.forgetting_attn``), imported (once per process, as any module);
    under Triton's interpreter each of fla's autotuned kernels kept to its first configuration (the module
    doc). An import that fails raises, and is tried again when next asked (by the next run)."""
    if not interpreting() or sys.modules.get(module) is not None:
        return importlib.import_module(module)
    with warnings.catch_warnings():
        # fla finds no GPU driver and says it rolls back to the CPU: under the interpreter that is the point
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        found = importlib.import_module(module)
    one_configuration()
    return found


def one_configuration() -> None:
    """Every autotuned kernel of fla's loaded modules keeps its first configuration alone: with one,
    Triton's ``Autotuner.run`` launches it without timing anything (with several it benchmarks them
    through the GPU driver). Asked again after each import (a later import defines more kernels);
    a kernel already kept to one is left as it is."""
    autotuner, jit = sys.modules.get("triton.runtime.autotuner"), sys.modules.get("triton.runtime.jit")
    if autotuner is None or jit is None:  # no Triton imported: no kernel of fla's is Triton's here
        return
    for name, loaded in list(sys.modules.items()):
        if loaded is None or not (name == "fla" or name.startswith("fla.")):
            continue
        for value in list(vars(loaded).values()):
            # a kernel is a chain of wrappers (heuristics, autotune, jit) down to the Python function
            while isinstance(value, jit.KernelInterface):
                if isinstance(value, autotuner.Autotuner) and len(value.configs) > 1:
                    value.configs = value.configs[:1]
                value = getattr(value, "fn", None)


def cu_seqlens(seg: Tensor) -> Tensor:
    """seg (B, T) segment ids -> the offsets of every segment of the flattened (1, B·T) sequence,
    ending with B·T (fla's convention); every window starts a segment too."""
    B, T = seg.shape
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    offsets = starts.flatten().nonzero().flatten()
    return torch.cat((offsets, offsets.new_tensor([B * T]))).to(torch.int32 if B * T < 2**31 else torch.int64)


# --- the recurrent layer kinds' chunked kernels ------------------------------------------------------
#: each recurrent mixer's kernel: (module, function)
KERNELS: dict[str, tuple[str, str]] = {
    "gated_delta": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
    "kda": ("fla.ops.kda", "chunk_kda"),
}


def usable(rule: str, q: Tensor, v: Tensor, policy: KernelPolicy) -> Callable | None:
    """fla's kernel for ``rule`` where it computes this call, else None: a device fla runs on
    (``fla_device``), and the kernel imported and run once forwards and backwards at this dtype and head
    sizes in this run (refused for the run, with one warning, if not). Asked in a compiled trace."""
    if not fla_device(q.device) or policy.fla_is_refused(rule):
        return None
    kernel = policy.fla_kernel(rule, q.device.type, q.dtype, q.shape[-1], v.shape[-1])
    return kernel if kernel is not None else _first_use(rule, q, v, policy)


def path(rule: str, device_type: str, policy: KernelPolicy) -> str:
    """The path a recurrence of ``rule`` takes on device_type in this run, as the run's record names it
    (posenc/nn/kernels.py): fla's kernel once its first use passed here, else the chunked form."""
    if fla_device(device_type) and policy.fla_ran(rule, device_type):
        return f"fla:{KERNELS[rule][1]}"
    return "chunked"


@torch_private.disable_dynamo  # eager inside a compiled forward; dynamo imported when first called
def _first_use(rule: str, q: Tensor, v: Tensor, policy: KernelPolicy) -> Callable | None:
    """Import the kernel and run it on a small input (gradients on, whatever the caller's mode); what
    happened goes to the run's policy. Eager even inside a compiled forward."""
    module, op = KERNELS[rule]
    try:
        kernel = getattr(import_fla(module), op)
        with torch.inference_mode(False), torch.enable_grad():
            *inputs, seg = _trial_inputs(rule, q.device, q.dtype, q.shape[-1], v.shape[-1])
            out = _call(kernel, rule, *inputs, seg)
            grads = torch.autograd.grad(out.sum(), [t for t in inputs if t is not None])
            float(sum(g.float().sum() for g in grads))  # waits for the kernels: their errors surface here
    except Exception as error:  # noqa: BLE001 - whatever fla raises, the chunked form computes the same thing
        reason = failures.first_line(error)
        hint = " (pip install 'posenc[fla]')" if isinstance(error, ImportError) else ""
        said = (f"flash-linear-attention's {op} is not usable on {q.device.type} ({reason}): the {rule} layers "
                f"use the chunked PyTorch recurrence for the rest of this run{hint}")
        if not policy.recover(failures.refusal(error, said), Running(recurrent=((rule, op),))):
            raise
        return None
    policy.fla_usable(rule, q.device.type, q.dtype, q.shape[-1], v.shape[-1], kernel)
    return kernel


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


def mix(kernel: Callable, rule: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None,
        seg: Tensor | None) -> Tensor:
    """The recurrence through fla's kernel (``usable``'s): q, k (B, H, T, dk) (q already scaled),
    v (B, H, T, dv), g (B, H, T) (kda: (B, H, T, dk)), beta (B, H, T) -> (B, H, T, dv)."""
    return _call(kernel, rule, q, k, v, g, beta, seg)


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


# --- the attention kernels the mechanisms offer --------------------------------------------------------
#: the ops each kernel needs: (module, op names), what ``load`` takes
FORGETTING = ("fla.ops.forgetting_attn", ("parallel_forgetting_attn",))
PATH = ("fla.ops.path_attn", ("parallel_path_attn",))
STICK_BREAKING = ("fla.ops.stickbreaking_attn", ("parallel_stickbreaking_attn",))
#: what fla's Triton kernels take
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: head dims: the softmax kernels hold a head in one block of up to 256; PaTH's are written for four
HEAD_DIMS = range(16, 257)
PATH_HEAD_DIMS = (16, 32, 64, 128)
#: FoX's log forget gates of a block, from its context (with the block's input) and layer: (B, H, T)
Gates = Callable[[Context, int], Tensor]
#: PaTH's transforms of a block: w (B, H, T, d) and β (B, H, T)
Transforms = Callable[[Context, int], tuple[Tensor, Tensor]]


def load(module: str, names: tuple[str, ...]) -> tuple:
    """fla's ops ``names`` from ``module``; ``KernelUnavailable`` where fla is not installed or refuses at
    import (the run's policy refuses the kernel and says so once)."""
    try:
        found = import_fla(module)
        return tuple(getattr(found, name) for name in names)
    except (ImportError, AttributeError, RuntimeError) as e:
        raise KernelUnavailable(
            f"flash-linear-attention's {', '.join(names)} ({module}) cannot be used here ({failures.first_line(e)}): "
            f"attention computes what it would have from the encoding's hooks, O(H·T²) memory per layer "
            f"(pip install 'posenc[fla]' for its kernels)", op=names[0]) from e


def guarded(key: tuple[str, tuple[str, ...]], op: Callable) -> Callable:
    """fla's op, its own refusal (``failures.refuses``) raised as ``KernelUnavailable`` naming it; any
    other error as it is."""

    def call(*args: object, **kwargs: object) -> object:
        try:
            return op(*args, **kwargs)
        except Exception as e:
            if not failures.refuses(e):
                raise
            module, names = key
            raise KernelUnavailable(
                f"flash-linear-attention's {', '.join(names)} ({module}) cannot be used here ({failures.first_line(e)}): "
                f"attention computes what it would have from the encoding's hooks, O(H·T²) memory per layer",
                op=names[0]) from e

    return call


def offered(kernel: FusedAttention, key: tuple[str, tuple[str, ...]]) -> FusedAttention:
    """kernel, named by its op for the run's record (``FusedPlan.op``)."""
    kernel.op = key[1][0]  # type: ignore[attr-defined]
    return kernel


def ops_here(key: tuple[str, tuple[str, ...]], ctx: Context, layer: int, head_dim: int, name: str,
             head_dims: range | tuple[int, ...], sliding: bool) -> tuple | None:
    """fla's ops for this layer in this context: None, silently, where fla's kernels do not run (the hooks
    are the design there); ``KernelUnavailable`` saying why where they run but cannot take this layer.
    sliding: whether the kernel takes a sliding window."""
    if not fla_device(ctx.device):
        return None
    window = ctx.mask(layer).window
    why = None
    if ctx.dtype not in DTYPES:
        why = f"takes float16, bfloat16 or float32, not {ctx.dtype}"
    elif head_dim not in head_dims:
        why = f"takes head_dim {head_dims[0]}..{head_dims[-1]}" if isinstance(head_dims, range) \
            else f"takes head_dim {', '.join(map(str, head_dims))}"
        why += f", this model has {head_dim}"
    elif window.limits(ctx.T) and not window.chunked and not sliding:
        why = f"takes no sliding window ({window.describe()})"
    if why is not None:
        raise KernelUnavailable(f"encoding '{name}': flash-linear-attention's {key[1][0]} {why}: attention computes "
                                f"it from the encoding's hooks (O(H·T²) memory per layer)", op=key[1][0], reason=why)
    return load(*key)


def with_gates(kernel: FusedAttention | None, gates: Gates) -> FusedAttention | None:
    """``kernel`` given a mechanism's log forget gates as well (FoX's around PaTH's kernel)."""
    if kernel is None:
        return None

    def gated(q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int, log_gates: Tensor | None = None) -> Tensor:
        g = gates(ctx, layer)
        return kernel(q, k, v, ctx, layer, g if log_gates is None else g + log_gates)

    gated.op = getattr(kernel, "op", "fused_attention")  # type: ignore[attr-defined]
    return gated


# --- the kernels the encodings offer ----------------------------------------------------------
def forgetting_kernel(ctx: Context, layer: int, head_dim: int, name: str, gates: Gates) -> FusedAttention | None:
    """FoX's attention (around an encoding acting on q and k alone) by fla's forgetting attention."""
    ops = ops_here(FORGETTING, ctx, layer, head_dim, name, HEAD_DIMS, sliding=True)
    if ops is None:
        return None
    (op,) = ops
    window = ctx.mask(layer).window
    if window.limits(ctx.T) and not window.chunked and "window_size" not in inspect.signature(op).parameters:
        why = "takes no sliding window in this fla (fla >= 0.5 does)"
        raise KernelUnavailable(f"encoding '{name}': flash-linear-attention's forgetting attention {why}: attention "
                                f"computes it from the encoding's hooks", op=FORGETTING[1][0], reason=why)

    def kernel(q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int, log_gates: Tensor | None = None) -> Tensor:
        g = gates(ctx, layer)
        return forgetting_attention(guarded(FORGETTING, op), q, k, v, g if log_gates is None else g + log_gates,
                                    ctx.mask(layer))

    return offered(kernel, FORGETTING)


def path_kernel(ctx: Context, layer: int, head_dim: int, name: str, transforms: Transforms) -> FusedAttention | None:
    """PaTH's attention (around an encoding acting on q and k alone; with a wrapping FoX's gates: PaTH-FoX)
    by fla's PaTH attention."""
    ops = ops_here(PATH, ctx, layer, head_dim, name, PATH_HEAD_DIMS, sliding=False)
    if ops is None:
        return None

    def kernel(q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int, log_gates: Tensor | None = None) -> Tensor:
        w, beta = transforms(ctx, layer)
        return path_attention(guarded(PATH, ops[0]), q, k, v, w, beta, log_gates, ctx.mask(layer))

    return offered(kernel, PATH)


def stick_breaking_kernel(ctx: Context, layer: int, head_dim: int, name: str) -> FusedAttention | None:
    """Stick-breaking attention by fla's (it takes no gates: a wrapping FoX leaves it to the hooks)."""
    ops = ops_here(STICK_BREAKING, ctx, layer, head_dim, name, HEAD_DIMS, sliding=False)
    if ops is None:
        return None

    def kernel(q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int, log_gates: Tensor | None = None) -> Tensor:
        if log_gates is not None:
            raise ValueError("fla's stick-breaking attention takes no forget gates")
        return stick_breaking_attention(guarded(STICK_BREAKING, ops[0]), q, k, v, ctx.mask(layer))

    return offered(kernel, STICK_BREAKING)


# --- the adapters: posenc's definitions in fla's arguments ------------------------------------------
def segments(mask: AttentionMask, batch: int, device: torch.device) -> Tensor | None:
    """(B, T) segment ids no key is seen across (documents, a chunked window's chunks), or None: one
    causal sequence per row. Documents are runs of equal ids in a window (as packing writes them)."""
    w = mask.window
    if not (w.chunked and w.limits(mask.T)):
        return mask.doc
    # ⌊i / size⌋ = ⌊j / size⌋: each chunk its own segment, inside each document
    chunk = torch.arange(mask.T, device=device if mask.doc is None else mask.doc.device) // w.size
    n_chunks = -(-mask.T // w.size)
    return chunk.expand(batch, -1) if mask.doc is None else mask.doc * n_chunks + chunk


def to_fla(mask: AttentionMask, *tensors: Tensor) -> tuple[list[Tensor], Tensor | None]:
    """(B, H, T, ...) tensors in fla's (B, T, H, ...) layout and the ``cu_seqlens`` of the mask's segments:
    with segments, one flattened (1, B·T, H, ...) sequence, as fla's kernels take documents."""
    B, T = tensors[0].shape[0], tensors[0].shape[2]
    out = [t.transpose(1, 2) for t in tensors]
    seg = segments(mask, B, tensors[0].device)
    if seg is None:
        return out, None
    return [t.reshape(1, B * T, *t.shape[2:]) for t in out], cu_seqlens(seg)


def from_fla(o: Tensor, B: int, T: int) -> Tensor:
    """fla's output (B, T, H, dv) or (1, B·T, H, dv) -> (B, H, T, dv)."""
    return o.reshape(B, T, *o.shape[2:]).transpose(1, 2)


def sliding_window(mask: AttentionMask) -> int | None:
    """fla's window_size for a sliding window (keys i - size < j <= i, as posenc's), else None."""
    w = mask.window
    return w.size if w.limits(mask.T) and not w.chunked else None


def forgetting_attention(op: Callable, q: Tensor, k: Tensor, v: Tensor, g: Tensor, mask: AttentionMask) -> Tensor:
    """softmax_j(q_i·k_j/√d + Σ_{t=j+1..i} g_t) v_j over the keys the mask shows, by fla's forgetting
    attention: q, k (B, H, T, d), v (B, H, T, dv), g (B, H, T) FoX's log forget gates log f_t, in log
    space and unscaled (fla adds their cumulative sums after its 1/√d, as FoX does) -> (B, H, T, dv)."""
    B, T = q.shape[0], q.shape[2]
    (q, k, v, g), offsets = to_fla(mask, q, k, v, g.float())
    window = sliding_window(mask)
    extra = {} if window is None else {"window_size": window}  # fla < 0.5 has no window_size (forgetting_kernel)
    o = op(q, k, v, g, scale=q.shape[-1] ** -0.5, cu_seqlens=offsets, **extra)
    return from_fla(o, B, T)


def path_attention(op: Callable, q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, g: Tensor | None,
                   mask: AttentionMask) -> Tensor:
    """softmax_j(q_iᵀ H_i···H_{j+1} k_j/√d + Σ_{t=j+1..i} g_t) v_j, H_t = I - β_t w_t w_tᵀ, by fla's PaTH
    attention (posenc/nn/encodings/householder.py has the same index convention, fla's): q, k (B, H, T, d),
    v (B, H, T, dv), w (B, H, T, d) unit per head, β (B, H, T) in (0, 2), g (B, H, T) a wrapping FoX's
    log forget gates or None -> (B, H, T, dv). fla adds its gates before its 1/√d, so it is given g·√d;
    w, β and g in float32, as it requires. No sliding window (``ops_here``)."""
    if sliding_window(mask) is not None:
        raise ValueError("fla's PaTH attention takes no sliding window")
    B, T, d = q.shape[0], q.shape[2], q.shape[-1]
    scale = d ** -0.5
    gates = [] if g is None else [g.float() / scale]
    (q, k, v, w, beta, *gates), offsets = to_fla(mask, q, k, v, w.float(), beta.float(), *gates)
    o, _ = op(q, k, v, w, beta, gates[0] if gates else None, scale=scale, cu_seqlens=offsets)
    return from_fla(o, B, T)


def stick_breaking_attention(op: Callable, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask) -> Tensor:
    """posenc's stick-breaking (posenc/nn/encodings/stick_breaking.py): A_ij = σ(z_ij) Π_{j<l<i} σ(-z_il)
    over the keys j < i the mask shows, z = q·k/√d, and what is left of the stick on the query's own
    value. fla's kernel over keys j < i (attend_current=False) returns o_i = Σ_j A_ij v_j and the
    remainder r_i = 1 - Σ_j A_ij; the output is o + r·v: q, k (B, H, T, d), v (B, H, T, dv) -> (B, H, T, dv)."""
    if sliding_window(mask) is not None:
        raise ValueError("fla's stick-breaking attention takes no sliding window")
    B, T = q.shape[0], q.shape[2]
    (q, k, v), offsets = to_fla(mask, q, k, v)
    o, rem = op(q, k, v, scale=q.shape[-1] ** -0.5, attend_current=False, cu_seqlens=offsets)
    return from_fla(o + rem.unsqueeze(-1).to(o.dtype) * v, B, T)
