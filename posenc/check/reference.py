"""The attention every path must compute, written out in float64 from its definition, from the
encoding's own hooks (what `posenc check` and posenc's tests compare each kernel against):

    z_ij = s_ij/√E + b(i, j) + content_ij + (c_i - c_j),   -inf where key j is hidden
    s_ij = q_i·k_j, unless the encoding replaces it (PaTH's scores, as one whole block)
    o_i = Σ_j w_ij v_j,   w = softmax_j(z_i·) — with a sink: exp(z_ij) / (Σ_k exp(z_ik) + exp(s_h))
                              — with a replaced normaliser: that normaliser of z

q arrives already scaled by the encoding's logit scale (``attention.encode`` does that); each
term is the encoding's own output, as the bias is: the terms themselves are pinned to their
papers in the encodings' own tests. Which keys a query sees is written out pair by pair from the
mask's definition (``visible``), never taken from posenc/nn/mask.py.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.nn.attention import NO_TERMS, LayerTerms
from posenc.nn.mask import Window


def reference(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, extra: Tensor | None = None,
              terms: LayerTerms = NO_TERMS) -> Tensor:
    """q, k (B, H, T, E), v (B, H, T, Ev), visible (B|1, 1, T, T) bool, extra: the position bias
    (broadcastable to (B, H, T, T)) -> (B, H, T, Ev)."""
    T = q.shape[-2]
    s = terms.scores(0, T, 0) if terms.scores is not None else q @ k.transpose(-1, -2)
    scores = s / math.sqrt(q.shape[-1])
    if extra is not None:
        scores = scores + extra
    if terms.content is not None:
        scores = scores + terms.content
    if terms.decay is not None:
        scores = scores + (terms.decay[..., :, None] - terms.decay[..., None, :])
    scores = scores.masked_fill(~visible, float("-inf"))
    if terms.normalise is not None:
        weights = terms.normalise(scores, torch.arange(T), torch.arange(T))
    elif terms.sink is not None:
        sink = terms.sink.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
        weights = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
    else:
        weights = scores.softmax(-1)
    return weights.to(v.dtype) @ v


def causal(T: int) -> Tensor:
    """(1, 1, T, T): key j visible to query i iff j <= i."""
    return torch.ones(T, T, dtype=torch.bool).tril()[None, None]


def visible(T: int, doc: Tensor | None, window: Window, B: int) -> Tensor:
    """(B, 1, T, T): key j visible to query i, from the definitions, pair by pair: causal, the same
    document, inside the window (sliding: i - j < size; chunked: the same chunk of size tokens)."""
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    ids = doc.tolist() if doc is not None else None
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                same_doc = ids is None or ids[b][i] == ids[b][j]
                if window.size is None:
                    inside = True
                elif window.chunked:
                    inside = i // window.size == j // window.size
                else:
                    inside = i - j < window.size
                out[b, 0, i, j] = same_doc and inside
    return out
