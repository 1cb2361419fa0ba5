"""An encoding's own kernel (``fused_attention``) computes the attention its hooks define.

Attention takes an encoding's kernel wherever the encoding offers one for a layer's context
(posenc/nn/kernel_plan.py), and every other path is checked against the hooks; so the kernel is
held to the hooks' plan itself, the explicit-mask path (``attention.dense_plan``): under each of
paths.MASKS (causal, documents, windows, chunks), in float64 on the CPU, with the encodings in
evaluation and in training, its output and the gradients of a random projection of it with respect
to q, k, v, the block's input and every encoding parameter, each within TOLERANCE. The kernel is
called as attention calls it: q and k after ``transform_qk`` and the logit scale, v, the context with
the block's input, the layer, no log gates.

Where they differ, a second measurement names what differs: the kernel's attention weights are read
out (v one-hot over the keys, head_dim of them per call), and the log-ratio of its weights to the
hooks' on the visible pairs, less each row's value at its own position (softmax's free constant), is
tested for being a function of (head, i − j) alone — a bias the kernel computes otherwise than
``distance_bias`` / ``position_bias`` — and for being a multiple of q·k/√d — a kernel that scales the
scores otherwise. Where it is neither, the note says so and names no hook.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from posenc.check import reference as ref
from posenc.check.hooks import layer_encodings
from posenc.check.paths import MASKS
from posenc.check.results import CheckResult, Measured, in_modes, max_abs, not_offered
from posenc.check.subject import MODE_NAMES, MODES, Subject, seeded
from posenc.nn import attention
from posenc.nn.encodings.base import Context, KernelUnavailable, PositionalEncoding
from posenc.nn.mask import AttentionMask, document_positions

NAME = "fused_attention = the hooks (explicit mask)"
#: float64 outputs and gradients of the kernel and of the hooks agree to this
TOLERANCE = 1e-10
#: batch of the q, k, v the kernel is given (heads, head_dim and T are the subject's)
B = 2


def contexts(s: Subject, layer: int) -> Iterator[tuple[str, Context]]:
    """(mask, the per-forward context, as the model builds it) for each of paths.MASKS."""
    T, doc = s.T, s.documents()
    for label, (documents, window) in MASKS.items():
        d = doc if documents else None
        mask = AttentionMask(T, d, window)
        yield label, (Context.at(document_positions(doc), torch.float64, d, (mask,) * (layer + 1), n_positions=T)
                      if documents else Context.arange(T, dtype=torch.float64, masks=(mask,) * (layer + 1)))


def fused_kernel(s: Subject) -> list[CheckResult]:
    """Wherever an encoding offers its own kernel, its output and gradients equal the hooks' plan's."""
    found: dict[str, Measured] = {}
    for mode in MODES:
        compared, worst = 0, (-1.0, "", None)
        for layer, encoding in layer_encodings(s, mode):
            for label, ctx in contexts(s, layer):
                kernel = encoding.fused_attention(ctx, layer) if encoding.offers("fused_attention") else None
                if kernel is None:
                    continue
                try:
                    gap, what = compare(encoding, kernel, ctx, layer)
                except KernelUnavailable:
                    continue
                compared += 1
                if gap > worst[0]:
                    worst = (gap, f"under the mask {label}" + (f", layer {layer}" if layer else "")
                             + f", the kernel differs from the hooks: {what}",
                             (encoding, kernel, ctx, layer))
        if compared:
            gap, where, case = worst
            found[mode] = Measured(gap <= TOLERANCE, f"max |Δ| {gap:.1e}, {compared} mask{'s' if compared > 1 else ''}",
                                   "" if gap <= TOLERANCE else f"{where}: {kernel_cause(*case)}")
    if not found:
        offered = any(e.offers("fused_attention") for _, e in layer_encodings(s))
        return [not_offered(NAME, "fused_attention offers no kernel on a CPU in float64 (the CUDA rows run the "
                            "model's own)" if offered else "no fused_attention")]
    return [in_modes(NAME, found, MODE_NAMES)]


def inputs(encoding: PositionalEncoding, T: int) -> list[Tensor]:
    """q, k, v (B, H, T, head_dim) and the block's input x (B, T, d_model), float64, requiring grad."""
    g = torch.Generator().manual_seed(11)
    shapes = [(B, encoding.n_head, T, encoding.head_dim)] * 3 + [(B, T, encoding.d_model)]
    return [torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_() for shape in shapes]


def run_both(encoding: PositionalEncoding, kernel, ctx: Context, layer: int, q: Tensor, k: Tensor, v: Tensor,
             x: Tensor) -> tuple[Tensor, Tensor]:
    """(the kernel's output, the hooks' plan's output) for one layer, each called as attention calls it."""
    T = q.shape[-2]
    inside = ctx.with_input(x)
    with seeded():
        encoding.prepare(ctx.n_positions)
        qt, kt = encoding.transform_qk(q, k, inside, layer)
        fused = kernel(attention.with_logit_scale(encoding, qt, inside, layer), kt, v, inside, layer, None)
    with seeded():
        encoding.prepare(ctx.n_positions)
        hooks = attention.attend_layer(q, k, v, encoding, inside, layer, attention.dense_plan(encoding, ctx, layer))
    if fused.shape != hooks.shape:
        raise ValueError(f"the kernel returned {tuple(fused.shape)}, the hooks' plan {tuple(hooks.shape)} (B, H, T={T}, dv)")
    return fused, hooks


def compare(encoding: PositionalEncoding, kernel, ctx: Context, layer: int) -> tuple[float, str]:
    """(largest |Δ| of the output and of every gradient, what it was) between the kernel and the hooks."""
    q, k, v, x = inputs(encoding, ctx.T)
    params = [p for p in encoding.parameters() if p.requires_grad]
    named = ["output", "∂/∂q", "∂/∂k", "∂/∂v", "∂/∂x"] + [f"∂/∂{n}" for n, p in encoding.named_parameters()
                                                        if p.requires_grad]
    fused, hooks = run_both(encoding, kernel, ctx, layer, q, k, v, x)
    g = torch.randn(hooks.shape, generator=torch.Generator().manual_seed(12), dtype=hooks.dtype)
    wrt = [q, k, v, x, *params]
    grads = [torch.autograd.grad((out * g).sum(), wrt, allow_unused=True) for out in (fused, hooks)]
    gaps = [max_abs(fused, hooks)] + [max_abs(a if a is not None else torch.zeros_like(w), b if b is not None
                                              else torch.zeros_like(w)) for a, b, w in zip(*grads, wrt)]
    worst = max(range(1, len(gaps)), key=gaps.__getitem__)
    return max(gaps), f"its output by {gaps[0]:.1e} and its gradients by up to {gaps[worst]:.1e} ({named[worst]})"


def weights(encoding: PositionalEncoding, kernel, ctx: Context, layer: int) -> tuple[Tensor, Tensor, Tensor]:
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
            for w, o in zip(out, run_both(encoding, kernel, ctx, layer, q, k, v, x)):
                w[..., keys] = o[..., : len(keys)]
        qt, kt = encoding.transform_qk(q, k, ctx.with_input(x), layer)
        qt = attention.with_logit_scale(encoding, qt, ctx.with_input(x), layer)
    return out[0], out[1], qt @ kt.transpose(-1, -2) / math.sqrt(d)


def kernel_cause(encoding: PositionalEncoding, kernel, ctx: Context, layer: int) -> str:
    """What differs between the kernel and the hooks, as measured on their attention weights."""
    fused, hooks, scores = weights(encoding, kernel, ctx, layer)
    T = ctx.T
    seen = ref.visible(T, ctx.doc, ctx.mask(layer).window, B).expand_as(fused) & (fused > 0) & (hooks > 0)
    if max_abs(fused, hooks) <= TOLERANCE:
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
