"""Whether the window's length reaches the logits, and which hook lets it.

A causal language model promises more than "the future reaches no past logit": the logits of the
first t tokens of a window are those of the same t tokens run alone, whatever the window's length
T. Evaluation at 16× the training length, documents packed into a window, the chunked path of long
evaluation (a slice of queries and the keys they see) and generation with a growing window all rely
on it. The causality row cannot see a hook that reads T (``ctx.T``, ``q_pos.shape[-1]``, the length
``prepare`` is given): it changes tokens, never the window's length. A bias −(i − j)(T − i)/T keeps
causality and breaks this.

Where the row fails, ``length_readers`` asks each hook the layers use for the first t positions,
once in a window of T and once in a window of t, and names the hooks whose outputs differ: what the
notes of this row, the documents row and the chunked path's row say.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc.check.paths import layer_encodings
from posenc.check.results import EXACT, CheckResult, holds, max_abs
from posenc.check.subject import Subject
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.mask import AttentionMask

NAME = "prefix: first t tokens = them alone"


def prefixes(T: int) -> list[int]:
    """The prefix lengths t compared: 1 (a token alone), a short prefix, half the window, all but
    the last token."""
    return sorted({t for t in (1, 5, T // 2, T - 1) if 0 < t < T})


def prefix_gaps(s: Subject) -> dict[int, float]:
    """t -> max |Δ| between the window's logits at 0..t-1 and those of tokens 0..t-1 run alone."""
    model, x = s.model(), s.tokens()
    with torch.no_grad():
        full = model(x)[0]
        return {t: max_abs(full[:, :t], model(x[:, :t])[0]) for t in prefixes(s.T)}


def prefix_consistency(s: Subject) -> list[CheckResult]:
    """The logits of the first t tokens of a window equal those of the t tokens alone, for several t."""
    gaps = prefix_gaps(s)
    worst = max(gaps.values())
    measured = f"max |Δ| {worst:.1e} (t = {', '.join(map(str, gaps))} of {s.T})"
    return [holds(NAME, worst <= EXACT, measured, "" if worst <= EXACT else length_note(s, gaps))]


def length_note(s: Subject, gaps: dict[int, float]) -> str:
    """Why the first t tokens' logits change with the window's length: the hooks that read it."""
    wrong = [t for t, gap in gaps.items() if gap > EXACT]
    readers = length_readers(s)
    where = f"the logits of the first {', '.join(map(str, wrong))} tokens change with the window's length"
    if not readers:
        return (f"{where}, though no hook's output for those positions does: state kept between forwards "
                f"(a cache sized by prepare(length)?) or a module outside the encoding reads the whole window")
    return (f"{where}: {', '.join(readers)} {'reads' if len(readers) == 1 else 'read'} it (its output for the first "
            f"{s.T // 2} positions differs between a window of {s.T} and one of {s.T // 2}) — compute from the "
            f"positions given (ctx.pos, q_pos, k_pos), never from T, ctx.T or how many positions there are")


def length_readers(s: Subject) -> list[str]:
    """The hooks (with the layer where the model has several encodings) whose output for the first
    t = T/2 positions differs between a window of T and one of t: what reads the window's length."""
    T, t = s.T, s.T // 2
    encodings = layer_encodings(s)
    found = []
    for layer, encoding in encodings:
        g = torch.Generator().manual_seed(5)
        q, k = (torch.randn(2, encoding.n_head, T, encoding.head_dim, generator=g, dtype=torch.float64) for _ in "qk")
        x = torch.randn(2, T, encoding.d_model, generator=g, dtype=torch.float64)
        scores = torch.randn(2, encoding.n_head, T, T, generator=g, dtype=torch.float64)
        whole, prefix = (hook_outputs(encoding, q[..., :n, :], k[..., :n, :], x[:, :n], scores[..., :n, :n], layer)
                         for n in (T, t))
        for hook, out in prefix.items():
            if hook in whole and max_abs(first(whole[hook], t), first(out, t)) > EXACT:
                found.append(hook if len(encodings) == 1 else f"{hook} (layer {layer})")
    return found


def first(value: tuple[Tensor, bool], t: int) -> Tensor:
    """A hook's output for the first t positions: (..., t, t) on and below the diagonal for a
    query-by-key term (pairwise; the future is masked anyway), (..., t, E) for a per-position one."""
    x, pairwise = value
    if pairwise:
        return x[..., :t, :t].masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), 0.0)
    return x[..., :t, :]


#: each hook and whether its output is a query-by-key term (..., n, n) or per position (..., n, E)
PAIRWISE = {"embed": False, "transform_qk": False, "position_bias": True, "content_bias": True, "qk_scores": True,
            "decay": True, "logit_scale": False, "normalise": True}


def hook_outputs(encoding: PositionalEncoding, q: Tensor, k: Tensor, x: Tensor, scores: Tensor,
                 layer: int) -> dict[str, tuple[Tensor, bool]]:
    """What each hook the encoding offers gives in a window of n = q.shape[-2] positions 0..n-1:
    hook -> (output, pairwise) (PAIRWISE). A hook that raises is left out (the rows that run the
    model report the exception)."""
    n = q.shape[-2]
    ctx = Context.arange(n, dtype=torch.float64, masks=(AttentionMask(n),) * (layer + 1)).with_input(x)
    pos, hidden = torch.arange(n), ~torch.ones(n, n, dtype=torch.bool).tril()
    out: dict[str, tuple[Tensor, bool]] = {}
    with torch.no_grad():
        encoding.prepare(n)
        try:
            rq, rk = encoding.transform_qk(q, k, ctx, layer) if encoding.offers("transform_qk") else (q, k)
        except Exception:  # noqa: BLE001 - as below: the hooks after it are asked with q and k as they are
            rq, rk = q, k
        calls: dict[str, Callable[[], Tensor | None]] = {
            "embed": lambda: encoding.embed(x, ctx),
            "transform_qk": lambda: torch.cat((rq, rk), dim=-1),
            "position_bias": lambda: encoding.position_bias(pos, pos),
            "content_bias": lambda: encoding.content_bias(rq, rk, ctx, layer),
            "qk_scores": lambda: encoding.qk_scores(rq, rk, ctx, layer)(0, n, 0),
            "decay": lambda: pairwise_decay(encoding.decay(ctx, layer)),
            "logit_scale": lambda: encoding.logit_scale(ctx, layer),
            "normalise": lambda: encoding.normalise(scores.masked_fill(hidden, float("-inf")), pos, pos),
        }
        for hook, call in calls.items():
            if not encoding.offers(hook):
                continue
            try:
                value = call()
            except Exception:  # noqa: BLE001, S112 - the rows that run the model name the exception
                continue
            if value is not None:
                out[hook] = (value.double(), PAIRWISE[hook])
    return out


def pairwise_decay(c: Tensor | None) -> Tensor | None:
    """Cumulative log-decays c (B, H, n) -> the logit terms c_i - c_j (B, H, n, n) they add."""
    return None if c is None else c[..., :, None] - c[..., None, :]
