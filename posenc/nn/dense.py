"""The explicit-mask path: SDPA with a boolean mask, or the position bias as a float mask with -inf on
hidden keys, what an encoding adds to a layer's logits joined to it, and the weights written out where
no fused kernel computes them (posenc/nn/attention.py chooses this path and calls ``attend``).

A plan (``DensePlan``) is one layer kind's mask and bias for one forward, shared by every layer with
that encoding and mask (attention's ``dense_plan`` builds it). Short sequences build the whole mask once per forward; long
ones (evaluation far beyond the training length) compute it for a chunk of queries at a time, and a
window limits each chunk's keys, so memory grows as H · chunk · keys, never H · T². Per layer a
content bias (CoPE) or decays (FoX) join those rows (``LayerTerms``, ``with_terms``), a sink is one
more key with a zero value and the sink's logit, and a replaced normaliser (stick-breaking) or scores
that replace q·k (PaTH) get the rows' logits written out (``explicit_weights``) instead of SDPA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn.context import Normaliser, ScoreRows
from posenc.nn.mask import AttentionMask

#: above this many positions an explicit mask is computed in query chunks
DENSE_MAX_LEN = 2048
#: query rows per chunk in the chunked path
QUERY_CHUNK = 512


@dataclass
class DensePlan:
    """One layer kind's scores for SDPA's explicit mask: the mask alone (boolean) or the bias
    with -inf on hidden keys (float), shared by every layer with this encoding and mask.

    fn(q_pos, k_pos) -> (..., H, Tq, Tk) or None; pos: (T,) or (B, T) what fn sees; dense: the
    whole mask, (B|1, 1|H, T, T), when the sequence is short enough to hold it, else None and
    attention computes ``rows`` for a chunk of queries at a time."""

    mask: AttentionMask
    fn: Callable[[Tensor, Tensor], Tensor] | None
    pos: Tensor
    dtype: torch.dtype
    dense: Tensor | None = None

    @classmethod
    def build(cls, mask: AttentionMask, fn: Callable[[Tensor, Tensor], Tensor] | None, pos: Tensor,
              dtype: torch.dtype, max_len: int) -> DensePlan:
        """The plan, its whole mask computed where mask.T <= max_len (DENSE_MAX_LEN)."""
        plan = cls(mask, fn, pos, dtype)
        if mask.T <= max_len:
            plan.dense = plan.rows(0, mask.T, 0)
        return plan

    def rows(self, start: int, end: int, lo: int) -> Tensor:
        """The mask of queries start..end-1 over keys lo..end-1: (B|1, 1|H, end - start, end - lo)."""
        if self.dense is not None:
            return self.dense[..., start:end, lo:end]
        visible = self.mask.visible(start, end, lo, end, device=self.pos.device)  # (B|1, 1, rows, keys)
        if self.fn is None:
            return visible
        bias = self.fn(self.pos[..., start:end], self.pos[..., lo:end])  # (..., H, rows, keys)
        return bias.masked_fill(~visible, float("-inf")).to(self.dtype)


@dataclass(frozen=True)
class LayerTerms:
    """What one layer's encoding adds to its attention in one forward, beside the shared plan.

    content: (B, H, T, T) content bias; scores: replaces q·k, in row blocks; decay: (B, H, T)
    cumulative log-decays c (the logit of query i and key j gains c_i - c_j); sink: (H,) sink
    logits; normalise: replaces softmax."""

    content: Tensor | None = None
    scores: ScoreRows | None = None
    decay: Tensor | None = None
    sink: Tensor | None = None
    normalise: Normaliser | None = None

    @property
    def empty(self) -> bool:
        return (self.content is None and self.scores is None and self.decay is None and self.sink is None
                and self.normalise is None)

    @property
    def explicit(self) -> bool:
        """The weights must be written out: softmax is replaced, or q·k is."""
        return self.normalise is not None or self.scores is not None


NO_TERMS = LayerTerms()


def with_terms(mask: Tensor, terms: LayerTerms, start: int, lo: int) -> Tensor:
    """The layer's logit terms for queries start.. and keys lo.. joined to the mask's rows."""
    end = start + mask.shape[-2]
    if terms.content is not None:
        mask = with_content(mask, terms.content[..., start:end, lo:lo + mask.shape[-1]])
    if terms.decay is not None:
        c = terms.decay  # (B, H, T)
        decay = c[..., start:end, None] - c[..., None, lo:lo + mask.shape[-1]]  # (B, H, rows, keys): c_i - c_j
        mask = with_content(mask, decay)
    return mask


def explicit_weights(q: Tensor, k: Tensor, mask: Tensor, terms: LayerTerms = NO_TERMS, start: int = 0,
                     lo: int = 0) -> Tensor:
    """The attention weights written out: the encoding's normaliser (softmax unless replaced,
    with the sink in the denominator) of s/√E + mask, s = q·kᵀ unless the encoding replaces it
    (``terms.scores``), where ``mask`` already holds the layer's terms (``with_terms``).
    q (B, H, rows, E), k (B, H, keys, E) -> (B, H, rows, keys) in at least float32."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    rows = q.shape[-2]
    qk = terms.scores(start, start + rows, lo).to(dtype) if terms.scores is not None \
        else q.to(dtype) @ k.to(dtype).transpose(-1, -2)
    scores = qk / math.sqrt(q.shape[-1]) + float_mask(mask, dtype)
    if terms.normalise is not None:
        keys = scores.shape[-1]
        return terms.normalise(scores, torch.arange(start, start + rows, device=q.device),
                               torch.arange(lo, lo + keys, device=q.device))
    if terms.sink is None:
        return scores.softmax(-1)
    sink = terms.sink.to(dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
    return torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]


def float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as 0 / -inf logits; a float mask as it is."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def with_content(mask: Tensor, content: Tensor) -> Tensor:
    """A logit term (B, H, rows, keys) joined to an explicit mask: added to a float mask
    (whose hidden keys are -inf already), or -inf where a boolean mask hides the key."""
    if mask.dtype == torch.bool:
        return content.masked_fill(~mask, float("-inf"))
    return content + mask.to(content.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, plan: DensePlan | None, terms: LayerTerms = NO_TERMS,
           dropout_p: float = 0.0, query_chunk: int | None = None) -> Tensor:
    """One layer's attention through the explicit mask. q, k: (B, H, T, E), v: (B, H, T, Ev) -> (B, H, T, Ev).

    plan: the layer's mask and bias (None: causal over the window, for terms without a plan); terms: what
    its encoding adds in this layer; query_chunk: rows per chunk of a plan without a whole mask (default
    QUERY_CHUNK; `posenc check` takes chunks that do not divide a short T, to test the long-sequence path)."""
    T = q.shape[-2]
    if plan is None:
        plan = DensePlan.build(AttentionMask(T), None, torch.arange(T, device=q.device), q.dtype, DENSE_MAX_LEN)
    chunk = T if plan.dense is not None else (query_chunk or QUERY_CHUNK)
    out = v.new_empty(*v.shape[:-2], T, v.shape[-1]) if chunk < T else None
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        lo = plan.mask.key_range(start, end)[0] if chunk < T else 0
        y = attend_rows(q[..., start:end, :], k[..., lo:end, :], v[..., lo:end, :], plan.rows(start, end, lo),
                        terms, start, lo, dropout_p)
        if out is None:
            return y
        out[..., start:end, :] = y
    return out


def attend_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, terms: LayerTerms, start: int, lo: int,
                dropout_p: float) -> Tensor:
    """Queries start.. against keys lo..: q (B, H, rows, E), k (B, H, keys, E), v (B, H, keys, Ev),
    mask (B|1, 1|H, rows, keys) boolean or float -> (B, H, rows, Ev). SDPA, unless the encoding
    replaces softmax; a sink joins as one more key with a zero value and the sink's logit."""
    mask = with_terms(mask, terms, start, lo)
    if terms.explicit:
        w = explicit_weights(q, k, mask, terms, start, lo)
        return F.dropout(w, dropout_p).to(v.dtype) @ v
    if terms.sink is not None:
        B, H = q.shape[:2]
        mask = float_mask(mask, q.dtype).expand(B, H, -1, -1)
        sink = terms.sink.to(mask.dtype)[None, :, None, None].expand(B, H, mask.shape[-2], 1)
        mask = torch.cat((mask, sink), dim=-1)  # (B, H, rows, keys + 1)
        k = torch.cat((k, k.new_zeros(*k.shape[:-2], 1, k.shape[-1])), dim=-2)  # q·0 = 0: the logit is s_h
        v = torch.cat((v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])), dim=-2)  # and its value is zero
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype) if mask.is_floating_point() else mask,
                                          dropout_p=dropout_p)
