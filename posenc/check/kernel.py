"""An encoding's own kernel (``fused_attention``) computes the attention its hooks define.

Attention takes an encoding's kernel wherever the encoding offers one for a layer's context
(posenc/nn/attention.py), and every other path is checked against the hooks; so the kernel is
held to the hooks' plan itself, the explicit-mask path (``attention.dense_plan``): under each of
paths.MASKS (causal, documents, windows, chunks), with the encodings in evaluation and in training,
its output and the gradients of a random projection of it with respect to q, k, v, the block's
input and every encoding parameter, against the hooks in float64 on the CPU. The kernel is called as
attention calls it: q and k after ``transform_qk`` and the logit scale, v, the context with the
block's input, the layer, no log gates.

The kernel is asked for in float64 first, compared to TOLERANCES[float64]; a kernel that takes no
float64 (a GPU kernel run on the CPU by Triton's interpreter: flash-linear-attention's, under
``TRITON_INTERPRET=1``, posenc/nn/fla_kernels.py) is asked for in float32, on a copy of the encoding
in float32, and compared to the float64 hooks relative to each tensor's largest value
(TOLERANCES[float32]). A GPU kernel's smallest tile is 16 wide (``tl.dot``'s least dimension), so
the row is measured with at least MIN_HEAD_DIM dimensions per head (``kernel_subject``: the
subject's 4 heads of 8 become 2 of 16). The row's ``measured`` names what was compared: the kernel's
op and precision, or none offered on this machine.

Where they differ, a second measurement names what differs: the kernel's attention weights are read
out (v one-hot over the keys, head_dim of them per call), and the log-ratio of its weights to the
hooks' on the visible pairs, less each row's value at its own position (softmax's free constant), is
tested for being a function of (head, i − j) alone — a bias the kernel computes otherwise than
``distance_bias`` / ``position_bias`` — and for being a multiple of q·k/√d — a kernel that scales the
scores otherwise. Where it is neither, the note says so and names no hook.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.check import reference as ref
from posenc.check.hooks import layer_encodings
from posenc.check.paths import MASKS
from posenc.check.results import CheckResult, Measured, in_modes, max_abs, not_offered
from posenc.check.subject import MODE_NAMES, MODES, Subject, seeded
from posenc.nn import attention
from posenc.nn.encodings.base import Context, FusedAttention, KernelUnavailable, PositionalEncoding
from posenc.nn.fla_kernels import interpreting
from posenc.nn.mask import AttentionMask, document_positions

NAME = "fused_attention = the hooks (explicit mask)"
#: the precisions a kernel is asked for, in order, and how close its outputs and gradients come to the
#: float64 hooks': float64 absolutely; float32 relative to each compared tensor's largest value (the
#: interpreted fla kernels measured 3e-7 for FoX and stick-breaking, 4e-5 for PaTH's products of
#: transforms at T = 128: docs/check.md)
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4}
#: the fewest dimensions per head the row asks a kernel at (a GPU kernel's smallest tile)
MIN_HEAD_DIM = 16
#: batch of the q, k, v the kernel is given (heads, head_dim and T are the subject's)
B = 2


@dataclass(frozen=True)
class Offered:
    """A kernel an encoding offered for a context: the encoding it was asked of (the subject's, or a copy
    in the kernel's precision), the kernel, and the context it was asked for (its dtype the kernel's)."""

    encoding: PositionalEncoding
    kernel: FusedAttention
    ctx: Context

    @property
    def dtype(self) -> torch.dtype:
        return self.ctx.dtype

    def describe(self) -> str:
        """The kernel as the row's ``measured`` names it: its op, its precision, where it ran."""
        where = " through Triton's interpreter" if interpreting() and self.dtype != torch.float64 else ""
        return f"{getattr(self.kernel, 'op', 'fused_attention')} in {str(self.dtype).removeprefix('torch.')}{where}"


def kernel_subject(s: Subject) -> Subject:
    """The subject with at least MIN_HEAD_DIM dimensions per head (fewer heads of the same d_model), or
    as it is where it has them or no such head count divides d_model."""
    d_model, n_head = int(s.cfg.model.d_model), int(s.cfg.model.n_head)
    heads = d_model // MIN_HEAD_DIM
    if d_model // n_head >= MIN_HEAD_DIM or heads == 0 or d_model % heads:
        return s
    return Subject(s.with_changes(**{"model.n_head": heads}))


def contexts(s: Subject, layer: int, dtype: torch.dtype = torch.float64) -> Iterator[tuple[str, Context]]:
    """(mask, the per-forward context, as the model builds it) for each of paths.MASKS."""
    T, doc = s.T, s.documents()
    for label, (documents, window) in MASKS.items():
        d = doc if documents else None
        mask = AttentionMask(T, d, window)
        yield label, (Context.at(document_positions(doc), dtype, d, (mask,) * (layer + 1), n_positions=T)
                      if documents else Context.arange(T, dtype=dtype, masks=(mask,) * (layer + 1)))


def offer(encoding: PositionalEncoding, s: Subject, label: str, layer: int) -> Offered | None:
    """The encoding's kernel for block ``layer`` under the mask ``label``, in the first precision of
    TOLERANCES it is offered in, or None. A precision or mask its kernel does not take (the hook raises
    ``KernelUnavailable``) is no fallback of the check's: the row says what it compared."""
    for dtype in TOLERANCES:
        asked = encoding if dtype == torch.float64 else copy.deepcopy(encoding).to(dtype)
        ctx = dict(contexts(s, layer, dtype))[label]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # what importing the kernel's library says is not the check's
                kernel = asked.fused_attention(ctx, layer)
        except KernelUnavailable:
            continue
        if kernel is not None:
            return Offered(asked, kernel, ctx)
    return None


def fused_kernel(s: Subject) -> list[CheckResult]:
    """Wherever an encoding offers its own kernel, its output and gradients equal the hooks' plan's."""
    s = kernel_subject(s)
    found: dict[str, Measured] = {}
    for mode in MODES:
        compared, worst, kernels = 0, (-1.0, "", None), set()
        for layer, encoding in layer_encodings(s, mode):
            if not encoding.offers("fused_attention"):
                continue
            for label, ctx in contexts(s, layer):
                offered = offer(encoding, s, label, layer)
                if offered is None:
                    continue
                try:
                    gap, what = compare(encoding, offered, ctx, layer)
                except KernelUnavailable:
                    continue
                compared += 1
                kernels.add(offered.describe())
                if gap > worst[0]:
                    worst = (gap, f"under the mask {label}" + (f", layer {layer}" if layer else "")
                             + f", the kernel differs from the hooks: {what}",
                             (encoding, offered, ctx, layer))
        if compared:
            gap, where, case = worst
            ok = gap <= TOLERANCES[case[1].dtype]
            found[mode] = Measured(ok, f"{', '.join(sorted(kernels))}: max |Δ| {gap:.1e}, "
                                       f"{compared} mask{'s' if compared > 1 else ''}",
                                   "" if ok else f"{where}: {kernel_cause(*case)}")
    if not found:
        offered = any(e.offers("fused_attention") for _, e in layer_encodings(s))
        return [not_offered(NAME, "fused_attention offers no kernel on this CPU (flash-linear-attention's run "
                            "under Triton's interpreter: TRITON_INTERPRET=1; the CUDA rows run the model's own)"
                            if offered else "no fused_attention")]
    return [in_modes(NAME, found, MODE_NAMES)]


def inputs(encoding: PositionalEncoding, T: int) -> list[Tensor]:
    """q, k, v (B, H, T, head_dim) and the block's input x (B, T, d_model), float64, requiring grad."""
    g = torch.Generator().manual_seed(11)
    shapes = [(B, encoding.n_head, T, encoding.head_dim)] * 3 + [(B, T, encoding.d_model)]
    return [torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_() for shape in shapes]


def run_both(encoding: PositionalEncoding, offered: Offered, ctx: Context, layer: int, q: Tensor, k: Tensor,
             v: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """(the kernel's output, the hooks' plan's output) for one layer, each called as attention calls it:
    the kernel on q, k, v and x in its precision (cast from the float64 leaves, so gradients reach them),
    the hooks in float64."""
    T, dtype = q.shape[-2], offered.dtype
    inside = offered.ctx.with_input(x.to(dtype))
    with seeded():
        offered.encoding.prepare(ctx.n_positions)
        qt, kt = offered.encoding.transform_qk(q.to(dtype), k.to(dtype), inside, layer)
        fused = offered.kernel(attention.with_logit_scale(offered.encoding, qt, inside, layer), kt, v.to(dtype),
                               inside, layer, None)
    with seeded():
        encoding.prepare(ctx.n_positions)
        hooks = attention.attend_layer(q, k, v, encoding, ctx.with_input(x), layer,
                                       attention.dense_plan(encoding, ctx, layer))
    if fused.shape != hooks.shape:
        raise ValueError(f"the kernel returned {tuple(fused.shape)}, the hooks' plan {tuple(hooks.shape)} (B, H, T={T}, dv)")
    return fused, hooks


def compare(encoding: PositionalEncoding, offered: Offered, ctx: Context, layer: int) -> tuple[float, str]:
    """(largest gap of the output and of every gradient, what it was) between the kernel and the hooks:
    max |Δ|, in float32 divided by the largest |value| of the hooks' tensor."""
    q, k, v, x = inputs(encoding, ctx.T)
    named = ["output", "∂/∂q", "∂/∂k", "∂/∂v", "∂/∂x"] + [f"∂/∂{n}" for n, p in encoding.named_parameters()
                                                        if p.requires_grad]
    fused, hooks = run_both(encoding, offered, ctx, layer, q, k, v, x)
    g = torch.randn(hooks.shape, generator=torch.Generator().manual_seed(12), dtype=hooks.dtype)
    grads = [torch.autograd.grad((out * g.to(out.dtype)).sum(),
                                 [q, k, v, x, *(p for p in e.parameters() if p.requires_grad)], allow_unused=True)
             for out, e in ((fused, offered.encoding), (hooks, encoding))]
    gaps = [gap(fused, hooks, offered.dtype)] + [gap(a, b, offered.dtype) for a, b in zip(*grads)]
    worst = max(range(1, len(gaps)), key=gaps.__getitem__)
    return max(gaps), f"its output by {gaps[0]:.1e} and its gradients by up to {gaps[worst]:.1e} ({named[worst]})"


def gap(a: Tensor | None, b: Tensor | None, dtype: torch.dtype) -> float:
    """max |a − b|, a missing gradient counted as zeros; below float64, relative to the largest |value|
    of b (of a, where b is zero)."""
    if a is None and b is None:
        return 0.0
    a, b = (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)
    if dtype == torch.float64 or not b.numel():
        return max_abs(a, b)
    scale = float(b.detach().abs().max()) or float(a.detach().abs().max())
    return max_abs(a, b) / scale if scale else 0.0


def weights(encoding: PositionalEncoding, offered: Offered, ctx: Context, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """(the kernel's attention weights, the hooks', the scaled scores q·k/√d) (B, H, T, T), read out with
    one-hot values: v holds e_(j mod d) at the head_dim keys j of one block, zero elsewhere."""
    q, k, _, x = (t.detach() for t in inputs(encoding, ctx.T))
    T, d = ctx.T, encoding.head_dim
    out = [torch.zeros(B, encoding.n_head, T, T, dtype=torch.float64) for _ in range(2)]
    with torch.no_grad():
        for start in range(0, T, d):
            keys = torch.arange(start, min(start + d, T))
            v = torch.zeros(B, encoding.n_head, T, d, dtype=torch.float64)
            v[:, :, keys, keys - start] = 1.0
            for w, o in zip(out, run_both(encoding, offered, ctx, layer, q, k, v, x)):
                w[..., keys] = o[..., : len(keys)]
        qt, kt = encoding.transform_qk(q, k, ctx.with_input(x), layer)
        qt = attention.with_logit_scale(encoding, qt, ctx.with_input(x), layer)
    return out[0], out[1], qt @ kt.transpose(-1, -2) / math.sqrt(d)


def kernel_cause(encoding: PositionalEncoding, offered: Offered, ctx: Context, layer: int) -> str:
    """What differs between the kernel and the hooks, as measured on their attention weights."""
    fused, hooks, scores = weights(encoding, offered, ctx, layer)
    T = ctx.T
    seen = ref.visible(T, ctx.doc, ctx.mask(layer).window, B).expand_as(fused) & (fused > 0) & (hooks > 0)
    if max_abs(fused, hooks) <= TOLERANCES[offered.dtype]:
        return "its attention weights equal the hooks', so it does not return the weights times v"
    if encoding.offers("normalise"):
        return f"its attention weights differ from the hooks' by {max_abs(fused, hooks):.1e}"
    diag = torch.arange(T)
    logit = (fused.clamp_min(1e-300).log() - hooks.clamp_min(1e-300).log()).masked_fill(~seen, 0.0)
    logit = logit - logit[..., diag, diag][..., :, None]  # softmax's free constant: each row against its own i
    distance = (diag[:, None] - diag[None, :]).expand_as(logit)
    spread = 0.0
    for n in range(T):
        at = seen & (distance == n)
        if at.any():
            per_head = logit.masked_fill(~at, float("nan"))
            spread = max(spread, float((per_head.nan_to_num(-1e300).amax((0, 2, 3))
                                        - per_head.nan_to_num(1e300).amin((0, 2, 3))).max()))
    size = float(logit.abs().max())
    if spread <= 1e-6 * max(size, 1.0):
        hook = "distance_bias" if encoding.offers("distance_bias") else "position_bias" \
            if encoding.offers("position_bias") else None
        return (f"their logits differ by a term of the head and i − j alone (up to {size:.2g}), "
                + (f"which the hooks take from {hook}: the kernel's bias disagrees with {hook}" if hook else
                   "a bias the hooks do not add"))
    s = (scores - scores[..., diag, diag][..., :, None]).masked_fill(~seen, 0.0)
    alpha = float((logit * s).sum() / (s * s).sum().clamp_min(1e-300))
    if max_abs(logit, alpha * s) <= 1e-6 * max(size, 1.0):
        return (f"their logits differ by {alpha:+.3g} × q·k/√d: the kernel scales the scores otherwise than 1/√d "
                f"(q already carries the logit scale)")
    return (f"their logits differ (up to {size:.2g} on the visible pairs) by a term that is neither a function of "
            f"i − j alone nor a multiple of q·k/√d")
