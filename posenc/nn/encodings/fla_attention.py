"""flash-linear-attention's attention kernels for the mechanisms that have one: FoX
(``parallel_forgetting_attn``), PaTH and PaTH-FoX (``parallel_path_attn``), stick-breaking
(``parallel_stickbreaking_attn``). Each computes a layer's whole attention block by block, never
writing its logits out; the encodings offer them through the contract's ``fused_attention`` hook
(posenc/nn/encodings/base.py), and attention takes them as a ``FusedPlan`` (posenc/nn/kernel_plan.py).
They run where fla's kernels run (posenc/nn/fla_runtime.py): on CUDA, and on a CPU under Triton's
interpreter, the same kernels through the same adapters.

The adapters (``forgetting_attention``, ``path_attention``, ``stick_breaking_attention``) are where
posenc's definitions meet fla's arguments: (B, H, T, d) to fla's (B, T, H, d); documents, and a
chunked window's chunks, as segments of one flattened sequence (``cu_seqlens``, no key seen across
one); a sliding window as fla's ``window_size`` where the kernel takes one; gates and remainders as
posenc defines them (each adapter says how). tests/test_fla_attention.py runs fla's Triton kernels
under the interpreter (and its naive references in their place) against posenc's own path.

Optional (``pip install 'posenc[fla]'``). On a CPU without the interpreter the encodings' hooks are
the design; where fla's kernels run, a kernel is not taken, with one warning per run naming why, where
fla is absent or refuses (an ImportError, a RuntimeError at import or when a kernel runs, as fla 0.6's
refusal of some Triton versions on Hopper), or the layer is beyond it (dtype, head dim, a sliding
window it does not take, attention dropout).

Only fla's own refusal counts as fla refusing: the adapters call fla's op through ``guarded``, which
turns what fla raises to refuse (``failures.refuses``: a RuntimeError of fla's own ``raise``, a Triton
error building the kernel) into ``KernelUnavailable``; anything else is raised as it is: an error of
posenc's own code around the call (the reshapes of ``to_fla``, the gates), and what fla or torch raise
about the arguments posenc passed (a shape, a layout, a dtype: fla's assertions and ValueErrors), a
bug to see, never a permanent O(T²) path blamed on fla. The run's policy
(posenc/nn/kernels.py) records a refusal and keeps the layer kind on its hooks from then on; a
refusal inside a kernel's backward reaches it through the train step (posenc/train/recovery.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.nn import failures, planning
from posenc.nn.encodings.context import Context, FusedAttention, KernelUnavailable
from posenc.nn.fla_runtime import fla_device, import_fla
from posenc.nn.fla_kernels import (
    cu_seqlens,  # the recurrent layers' offsets: the same convention
)
from posenc.nn.mask import AttentionMask

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

#: fla's ops as imported in this process (None: the import failed, ``_import_error`` says how): an import
#: is the process's, whichever run asked first; each run says a failed one again
_loaded: dict[tuple[str, tuple[str, ...]], tuple | None] = {}
_import_error: dict[tuple[str, tuple[str, ...]], str] = {}


def load(module: str, names: tuple[str, ...]) -> tuple | None:
    """fla's ops ``names`` from ``module``, imported once; None, with one warning per run, where fla is
    not installed or refuses at import."""
    key = (module, names)
    if key not in _loaded:
        try:
            found = import_fla(module)
            _loaded[key] = tuple(getattr(found, name) for name in names)
        except (ImportError, AttributeError, RuntimeError) as e:
            _loaded[key], _import_error[key] = None, failures.first_line(e)
    if _loaded[key] is None:
        planning.say(f"flash-linear-attention's {', '.join(names)} ({module}) cannot be used here "
                    f"({_import_error[key]}): attention computes what it would have from the encoding's hooks, "
                    f"O(H·T²) memory per layer (pip install 'posenc[fla]' for its kernels)")
    return _loaded[key]


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
                f"attention computes what it would have from the encoding's hooks, O(H·T²) memory per layer") from e

    return call


def offered(kernel: FusedAttention, key: tuple[str, tuple[str, ...]]) -> FusedAttention:
    """kernel, named by its op for the run's record (``FusedPlan.op``)."""
    kernel.op = key[1][0]  # type: ignore[attr-defined]
    return kernel


def ops_here(key: tuple[str, tuple[str, ...]], ctx: Context, layer: int, head_dim: int, name: str,
             head_dims: range | tuple[int, ...], sliding: bool) -> tuple | None:
    """fla's ops for this layer in this context, or None: silently where fla's kernels do not run (the
    hooks are the design there), else with one warning that says why. sliding: whether the kernel takes a
    sliding window."""
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
        planning.say(f"encoding '{name}': flash-linear-attention's {key[1][0]} {why}: attention computes it from "
                  f"the encoding's hooks (O(H·T²) memory per layer)")
        return None
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
        planning.say(f"encoding '{name}': this flash-linear-attention's forgetting attention takes no sliding window "
                  f"(fla >= 0.5 does): attention computes it from the encoding's hooks")
        return None

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
