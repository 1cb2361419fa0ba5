"""FlexAttention for biased encodings on CUDA (Dong et al., 2024, "Flex Attention").

An encoding's bias becomes a ``score_mod`` evaluated inside the fused kernel, so ALiBi's
slopes·(j - i) or T5's bucket table is computed per score on the fly: no H x T x T tensor,
on the forward or the backward, and T5's table receives its gradient through the captured
tensor. The causal mask is a ``BlockMask``, which lets the kernel skip every block above the
diagonal; it depends only on (T, device), so it is built once and cached.

FlexAttention has no backward on CPU (torch 2.13) and needs compilation to be fast, so this
path is for CUDA only; elsewhere attention uses SDPA with a float mask (``posenc.nn.attention``).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn.encodings.base import PositionalEncoding, ScoreMod

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None

_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """One warning per distinct reason per process, not one per forward."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


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
    """A biased encoding's attention for one forward: the bias as a score_mod, causal as a BlockMask."""

    score_mod: ScoreMod
    block_mask: object  # torch.nn.attention.flex_attention.BlockMask

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q, k, v: (B, H, T, hd) -> (B, H, T, hd)."""
        # inside a compiled model the outer compile fuses flex_attention; in eager, our compiled copy
        attend = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
        return attend(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask)


def flex_bias(encoding: PositionalEncoding, pos: Tensor, length: int) -> FlexBias | None:
    """The FlexAttention form of the encoding's bias, or None (with one warning saying why)
    where it cannot be had, so that the caller falls back to SDPA with a float mask."""
    if flex_attention is None:
        warn_once("FlexAttention is not available in this torch; biased attention falls back to "
                  "SDPA with a float mask (slower, O(H·T²) memory per layer) — upgrade torch to >= 2.5")
        return None
    score_mod = encoding.score_mod(pos, length)
    if score_mod is None:
        warn_once(f"encoding '{encoding.name}' offers no score_mod; its bias falls back to SDPA "
                  f"with a float mask on {pos.device.type} (slower, O(H·T²) memory per layer)")
        return None
    return FlexBias(score_mod, causal_block_mask(pos.shape[0], pos.device))
