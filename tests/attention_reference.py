"""The attention every path must compute, written out in float64 from its definition, for the
tests of the attention paths (test_attention_paths.py, test_masks.py, test_mechanisms.py):

    z_ij = s_ij/√E + b(i, j) + content_ij + (c_i - c_j),   -inf where key j is hidden
    s_ij = q_i·k_j, unless the encoding replaces it (PaTH's scores, as one whole block)
    o_i = Σ_j w_ij v_j,   w = softmax_j(z_i·) — with a sink: exp(z_ij) / (Σ_k exp(z_ik) + exp(s_h))
                              — with a replaced normaliser: that normaliser of z

q arrives already scaled by the encoding's logit scale (``encode`` does that); each term is the
encoding's own output, as the bias is: the terms themselves are tested against their papers in
the encodings' own tests.
"""

from __future__ import annotations

import math

import torch

from posenc.nn.attention import LayerTerms


def reference(q, k, v, visible, extra=None, terms: LayerTerms = LayerTerms()):
    """q, k (B, H, T, E), v (B, H, T, Ev), visible (B|1, 1, T, T) bool, extra: bias + content
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


def causal(T: int) -> torch.Tensor:
    """(1, 1, T, T): key j visible to query i iff j <= i."""
    return torch.ones(T, T, dtype=torch.bool).tril()[None, None]
