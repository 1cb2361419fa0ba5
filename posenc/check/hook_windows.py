"""Each hook of an encoding over a long window, at its first and at its last positions, in a dtype:
what the precision rows (posenc/check/precision.py) compare with the same encoding in float64.

A window of N positions 0..N-1 (the run's longest evaluation); q and k in the activations' dtype,
the block's input in float32 (the residual stream under autocast), held as float64 tensors of
those values so that the float64 encoding is given the same numbers. A per-position output is
taken at the first and the last WINDOW positions; a query-by-key term for those queries over every
key they see (the first over the first WINDOW keys, the last over all N), the hidden pairs zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from posenc.hardware import autocast_context
from posenc.nn.encodings.base import Context, PositionalEncoding, PositionOutOfRange
from posenc.nn.mask import AttentionMask

#: positions compared at each end of the window (the first ones, and the last ones up to N)
WINDOW = 32
#: the hooks measured, in the order a note names them
HOOKS = ("embed", "transform_qk", "position_bias", "decay", "logit_scale", "qk_scores", "normalise")
#: batch of the inputs the hooks are given (heads × positions give the samples)
B = 1


@contextlib.contextmanager
def computing(precision: str | None) -> Iterator[None]:
    """The run's autocast on the CPU (None: float64, no autocast), without gradients."""
    with torch.no_grad(), (autocast_context(precision, torch.device("cpu"))() if precision
                           else contextlib.nullcontext()):
        yield


def inputs(encoding: PositionalEncoding, N: int, dtype: torch.dtype) -> dict[str, Tensor]:
    """q, k (B, H, N, head_dim) in the activations' dtype, the block's input x (B, N, d_model) in float32
    and scores (B, H, WINDOW, N) in the activations' dtype, as float64 tensors holding those values."""
    g = torch.Generator().manual_seed(21)
    q, k = (torch.randn(B, encoding.n_head, N, encoding.head_dim, generator=g).to(dtype) for _ in "qk")
    x = torch.randn(B, N, encoding.d_model, generator=g)
    scores = torch.randn(B, encoding.n_head, WINDOW, N, generator=g).to(dtype)
    return {name: t.double() for name, t in {"q": q, "k": k, "x": x, "scores": scores}.items()}


def outputs(encoding: PositionalEncoding, layer: int, given: dict[str, Tensor], N: int, dtype: torch.dtype | None,
            precision: str | None) -> dict[str, tuple[Tensor, Tensor, str]]:
    """hook -> (its output at the first WINDOW positions, at the last, kind) for each hook of HOOKS
    the encoding offers, over a window of N positions. kind: ``vector`` (rows compared by their
    norm), ``logit`` (a logit term, elementwise against |b| + 1), ``absolute`` (already divided by its
    magnitude: qk_scores by |q_i||k_j|). dtype: the activations'
    (None: float64 throughout). A hook that refuses the positions (PositionOutOfRange) is left out."""
    act = dtype or torch.float64
    q, k, scores = (given[n].to(act) for n in ("q", "k", "scores"))
    x = given["x"].to(torch.float32 if dtype else torch.float64)
    pos, near, far = torch.arange(N), slice(0, WINDOW), slice(N - WINDOW, N)
    ctx = Context.arange(N, dtype=x.dtype, masks=(AttentionMask(N),) * (layer + 1)).with_input(x)
    causal_far = (torch.arange(N - WINDOW, N)[:, None] >= pos[None, :])  # (W, N): keys j <= i
    causal_near = causal_far[:, :WINDOW] & (torch.arange(WINDOW)[:, None] >= torch.arange(WINDOW)[None, :])

    def pairwise(term: Callable[[slice, slice], Tensor]) -> tuple[Tensor, Tensor, str]:
        """A query-by-key term for the first queries over the first keys and the last over every key,
        the hidden pairs zero."""
        return (term(near, near).double().masked_fill(~causal_near, 0.0),
                term(far, slice(0, N)).double().masked_fill(~causal_far, 0.0), "logit")

    calls: dict[str, Callable[[], tuple[Tensor, Tensor, str] | None]] = {}
    if encoding.offers("embed"):
        calls["embed"] = lambda: split(encoding.embed(x, ctx), -2, near, far, "vector")
    if encoding.offers("transform_qk"):
        calls["transform_qk"] = lambda: split(torch.cat(encoding.transform_qk(q, k, ctx, layer), -1), -2, near, far,
                                              "vector")
    if encoding.offers("position_bias"):
        calls["position_bias"] = lambda: pairwise(lambda a, b: encoding.position_bias(pos[a], pos[b]))
    if encoding.offers("decay"):
        def decay() -> tuple[Tensor, Tensor, str] | None:
            c = encoding.decay(ctx, layer)  # (B, H, N): c_i − c_j joins the logits, each c_i a sum over i gates
            return None if c is None else split(c[..., None], -2, near, far, "logit")
        calls["decay"] = decay
    if encoding.offers("logit_scale"):
        def logit_scale() -> tuple[Tensor, Tensor, str] | None:
            tau = encoding.logit_scale(ctx, layer)  # (B|1, H, N, 1), or None: no scale in this layer
            return None if tau is None else split(tau.expand(B, -1, N, 1), -2, near, far, "vector")
        calls["logit_scale"] = logit_scale
    if encoding.offers("qk_scores"):
        def qk_scores() -> tuple[Tensor, Tensor, str]:
            rows = encoding.qk_scores(q, k, ctx, layer)
            norm = given["q"].norm(dim=-1)[..., :, None] * given["k"].norm(dim=-1)[..., None, :]  # |q_i||k_j|
            near_s, far_s, _ = pairwise(lambda a, b: rows(a.start, a.stop, 0)[..., : b.stop])
            # s_ij = q_iᵀ P k_j with P a product of reflections: of the size of |q_i||k_j|, whose rounding it carries
            return near_s / norm[..., near, near], far_s / norm[..., far, :], "absolute"
        calls["qk_scores"] = qk_scores
    if encoding.offers("normalise"):
        def normalise() -> tuple[Tensor, Tensor, str]:
            out = []
            for rows, hidden in ((near, ~causal_near), (far, ~causal_far)):
                z = scores[..., : hidden.shape[-1]].masked_fill(hidden, float("-inf"))
                out.append(encoding.normalise(z, pos[rows], pos[: hidden.shape[-1]]).double())
            return out[0], out[1], "vector"
        calls["normalise"] = normalise
    found = {}
    with computing(precision):
        try:
            encoding.prepare(N)
        except PositionOutOfRange:  # an encoding that encodes fewer positions: the 4× row holds it to refusing
            return found
        for hook, call in calls.items():
            try:
                value = call()
            except PositionOutOfRange:
                continue
            if value is not None:
                found[hook] = value
    return found


def split(t: Tensor, dim: int, near: slice, far: slice, kind: str) -> tuple[Tensor, Tensor, str]:
    """t's first and last positions along dim, as float64."""
    t = t.double()
    index = [slice(None)] * t.dim()
    out = []
    for part in (near, far):
        index[dim] = part
        out.append(t[tuple(index)])
    return out[0], out[1], kind


def relative_error(got: Tensor, expected: Tensor, kind: str) -> float:
    """The largest error of got against expected, relative to expected's magnitude: a row's norm
    for a vector (``vector``), |b| + 1 for each logit term (``logit``: an error of δ in a logit
    scales an attention weight by e^δ, and a logit of size |b| rounds to ε·|b| in its dtype; a
    decay's c_i, a sum over i gates, likewise), none for a term already divided by it (``absolute``)."""
    if kind == "logit":
        return float(((got - expected).abs() / (expected.abs() + 1.0)).max())
    if kind == "absolute":  # already relative to its magnitude
        return float((got - expected).abs().max())
    return float(((got - expected).norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-30)).max())
