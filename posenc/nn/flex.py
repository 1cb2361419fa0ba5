"""FlexAttention for position biases on CUDA (Dong et al., 2024, "Flex Attention").

An encoding's bias becomes a ``score_mod`` evaluated inside the fused kernel, so ALiBi's
-m_h·(i - j) or T5's bucket table is computed per score on the fly: no H x T x T tensor, on
the forward or the backward, and a learned table receives its gradient through the captured
tensor. The mask is a ``BlockMask`` (posenc/nn/mask.py), which lets the kernel skip every block
above the diagonal, across documents or outside a window; without documents it depends only on
(T, window, device), so it is built once and cached.

FlexAttention has no backward on CPU (torch 2.13) and needs compilation to be fast, so
posenc.nn.attention takes this path on CUDA only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn.encodings.base import ScoreMod

try:
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # torch < 2.5
    flex_attention = None

#: whether this torch has FlexAttention
AVAILABLE = flex_attention is not None


@functools.cache
def compiled_flex_attention():
    """flex_attention compiled once. Uncompiled it materialises the scores (slow, O(T²) memory)."""
    return torch.compile(flex_attention, dynamic=False)


@dataclass
class FlexPlan:
    """One layer kind's attention for one forward: the bias as a score_mod (None: no bias), the
    mask (causal, documents, window) as a BlockMask whose empty blocks the kernel skips."""

    score_mod: ScoreMod | None
    block_mask: object  # torch.nn.attention.flex_attention.BlockMask

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q, k, v: (B, H, T, hd) -> (B, H, T, hd)."""
        # inside a compiled model the outer compile fuses flex_attention; in eager, our compiled copy
        attend = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
        return attend(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask)
