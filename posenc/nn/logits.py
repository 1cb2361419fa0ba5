"""A layer's logits written out: what an encoding adds to them (``LayerTerms``), joined to an
explicit mask (``with_terms``), and the weights computed from them when no fused kernel can
(``explicit_weights``: a replaced softmax or replaced q·k). posenc/nn/attention.py chooses when.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn.encodings.base import Normaliser, ScoreRows


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
