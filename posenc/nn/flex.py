"""FlexAttention for position biases on CUDA (Dong et al., 2024, "Flex Attention").

An encoding's bias becomes a ``score_mod`` evaluated inside the fused kernel, so ALiBi's
-m_h·(i - j) or T5's bucket table is computed per score on the fly: no H x T x T tensor, on
the forward or the backward, and a learned table receives its gradient through the captured
tensor. The causal mask is a ``BlockMask``, which lets the kernel skip every block above the
diagonal; it depends only on (T, device), so it is built once and cached.

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
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None

#: whether this torch has FlexAttention
AVAILABLE = flex_attention is not None


def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """mask_mod of a causal decoder: key j is visible to query i iff j <= i."""
    return q_idx >= kv_idx


@torch.compiler.disable  # a cache lookup, not something to trace: one graph break per forward
@functools.lru_cache(maxsize=16)
def causal_block_mask(length: int, device: torch.device):
    """The causal BlockMask for length x length, shared by every layer and step."""
    return create_block_mask(causal, B=None, H=None, Q_LEN=length, KV_LEN=length, device=device)


@functools.cache
def compiled_flex_attention():
    """flex_attention compiled once. Uncompiled it materialises the scores (slow, O(T²) memory)."""
    return torch.compile(flex_attention, dynamic=False)


@dataclass
class FlexBias:
    """A position bias for one forward: the bias as a score_mod, causal as a BlockMask."""

    score_mod: ScoreMod
    block_mask: object  # torch.nn.attention.flex_attention.BlockMask

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q, k, v: (B, H, T, hd) -> (B, H, T, hd)."""
        # inside a compiled model the outer compile fuses flex_attention; in eager, our compiled copy
        attend = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
        return attend(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask)

    def mask(self, start: int, end: int, dtype: torch.dtype) -> Tensor:
        raise TypeError("a FlexAttention bias has no dense mask; content biases take the SDPA path")
