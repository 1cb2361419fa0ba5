"""Which hook: a second measurement, made where a property fails, that names the hook responsible.

A ✗ row measures the whole model (the logits at 0..t moved when the tokens after t changed). Which
hook let it is measured separately, on each hook the layers use, alone: the hook is asked for the
first t = T/2 positions twice, with one thing changed in between, and is named where its output for
those positions differs (on and below the diagonal for a query-by-key term; the future is masked
anyway):

- ``future``: the same window of T positions, with the inputs at positions t.. (q, k, the block's
  input x, the scores a normaliser is given) drawn anew: a hook whose output for 0..t-1 changes
  reads later tokens (a mean over all keys, a sum without the mask);
- ``length``: a window of T positions against one of t, the inputs of the first t the same: a hook
  whose output changes reads the window's length (``ctx.T``, ``q_pos.shape``, what ``prepare`` was
  given) — or later tokens, which the ``future`` measurement tells apart;
- ``batch``: the same window, the inputs of every sequence but the first drawn anew: a hook whose
  output for the first sequence (all T positions) changes reads the other sequences of its batch
  (a mean over the batch dimension). An output without a batch dimension is compared whole.

A note names a cause only where this measurement shows it (posenc/check/model.py, length.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc.check.results import EXACT, max_abs
from posenc.check.subject import Subject, seeded
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.mask import AttentionMask

#: each hook and whether its output is a query-by-key term (..., n, n) or per position (..., n, E)
PAIRWISE = {"embed": False, "transform_qk": False, "position_bias": True, "content_bias": True, "qk_scores": True,
            "decay": True, "logit_scale": False, "normalise": True}
#: the sequences of the inputs a hook is asked with
BATCH = 2
#: what a second measurement changes between the two askings (the module doc)
CHANGES = ("future", "length", "batch")


def layer_encodings(s: Subject, mode: str = "eval") -> list[tuple[int, PositionalEncoding]]:
    """(first layer, encoding) for each distinct encoding the model's layers use, in mode."""
    model = s.model(mode=mode)
    seen: dict[int, tuple[int, PositionalEncoding]] = {}
    for layer in range(model.n_layer):
        e = model.encoding.for_layer(layer)
        seen.setdefault(id(e), (layer, e.double()))
    return list(seen.values())


def hooks_reading(s: Subject, change: str, mode: str = "eval") -> list[str]:
    """The hooks (with the layer where the model has several encodings) whose output for the first
    t = T/2 positions (``batch``: for the first sequence) differs when ``change`` (CHANGES) is made,
    the encodings in mode."""
    T, t = s.T, s.T // 2
    encodings = layer_encodings(s, mode)
    found = []
    for layer, encoding in encodings:
        g = torch.Generator().manual_seed(5)
        q, k = (torch.randn(BATCH, encoding.n_head, T, encoding.head_dim, generator=g, dtype=torch.float64)
                for _ in "qk")
        x = torch.randn(BATCH, T, encoding.d_model, generator=g, dtype=torch.float64)
        scores = torch.randn(BATCH, encoding.n_head, T, T, generator=g, dtype=torch.float64)
        whole = hook_outputs(encoding, q, k, x, scores, layer)
        if change == "length":
            other = hook_outputs(encoding, q[..., :t, :], k[..., :t, :], x[:, :t], scores[..., :t, :t], layer)
        else:  # future: the inputs from position t on drawn anew, the window's length kept; batch: every sequence
            # but the first drawn anew
            later = [v.clone() for v in (q, k, x, scores)]
            for v, dim in zip(later, (-2, -2, 1, -2)):
                part = v[1:] if change == "batch" else v.narrow(dim, t, T - t)
                part.copy_(torch.randn(part.shape, generator=g, dtype=torch.float64))
            if change == "future":
                later[3][..., :, t:] = torch.randn(*later[3].shape[:-1], T - t, generator=g, dtype=torch.float64)
            other = hook_outputs(encoding, *later, layer)
        for hook, out in other.items():
            if hook in whole and max_abs(*(compared(v, change, T, t) for v in (whole[hook], out))) > EXACT:
                found.append(hook if len(encodings) == 1 else f"{hook} (layer {layer})")
    return found


def compared(value: tuple[Tensor, bool], change: str, T: int, t: int) -> Tensor:
    """What of a hook's output a change must leave alone: the first t positions (``future``,
    ``length``); the first sequence, every position (``batch``; an output without a batch dimension,
    position_bias's (H, T, T), whole)."""
    if change != "batch":
        return first(value, t)
    x = first(value, T)
    return x[:1] if x.dim() >= 3 and x.shape[0] == BATCH else x


def first(value: tuple[Tensor, bool], t: int) -> Tensor:
    """A hook's output for the first t positions: (..., t, t) on and below the diagonal for a
    query-by-key term (pairwise; the future is masked anyway), (..., t, E) for a per-position one."""
    x, pairwise = value
    if pairwise:
        return x[..., :t, :t].masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), 0.0)
    return x[..., :t, :]


def hook_outputs(encoding: PositionalEncoding, q: Tensor, k: Tensor, x: Tensor, scores: Tensor,
                 layer: int) -> dict[str, tuple[Tensor, bool]]:
    """What each hook the encoding offers gives in a window of n = q.shape[-2] positions 0..n-1:
    hook -> (output, pairwise) (PAIRWISE), its random numbers drawn from one seed (``seeded``). A
    hook that raises is left out (the rows that run the model report the exception)."""
    n = q.shape[-2]
    ctx = Context.arange(n, dtype=torch.float64, masks=(AttentionMask(n),) * (layer + 1)).with_input(x)
    pos, hidden = torch.arange(n), ~torch.ones(n, n, dtype=torch.bool).tril()
    out: dict[str, tuple[Tensor, bool]] = {}
    with torch.no_grad(), seeded():
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


def which(hooks: list[str]) -> str:
    """'embed reads', 'content_bias and decay read': a list of hooks as a sentence's subject."""
    return f"{' and '.join(hooks)} {'reads' if len(hooks) == 1 else 'read'}"
