"""FlexAttention for position biases on CUDA (Dong et al., 2024, "Flex Attention").

An encoding's bias becomes a ``score_mod`` evaluated inside the fused kernel, so ALiBi's
-m_h·(i - j) or T5's bucket table is computed per score on the fly: no H x T x T tensor, on
the forward or the backward, and a learned table receives its gradient through the captured
tensor. A layer's decays (FoX) join the score_mod as c_i - c_j over the captured (B, H, T)
cumulative sums; a sink rescales the output with the log-sum-exp FlexAttention returns. The mask
is a ``BlockMask`` (posenc/nn/mask.py), which lets the kernel skip every block
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
try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # torch < 2.9 returns the log-sum-exp with return_lse=True
    AuxRequest = None

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
    eager: bool = False  # FlexAttention's eager forward (`posenc check` on CPU, where it has no backward)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, decay: Tensor | None = None,
               sink: Tensor | None = None) -> Tensor:
        """q, k: (B, H, T, E), v: (B, H, T, Ev) -> (B, H, T, Ev); decay: (B, H, T) cumulative
        log-decays of this layer; sink: (H,) its sink logits."""
        # inside a compiled model the outer compile fuses flex_attention; in eager, our compiled copy
        attend = flex_attention if self.eager or torch.compiler.is_compiling() else compiled_flex_attention()
        score_mod = with_decay(self.score_mod, decay)
        if sink is None:
            return attend(q, k, v, score_mod=score_mod, block_mask=self.block_mask)
        if AuxRequest is not None:
            out, aux = attend(q, k, v, score_mod=score_mod, block_mask=self.block_mask, return_aux=AuxRequest(lse=True))
            lse = aux.lse
        else:
            out, lse = attend(q, k, v, score_mod=score_mod, block_mask=self.block_mask, return_lse=True)
        # with the sink in the denominator every weight is softmax's × Σe^z / (Σe^z + e^s) = σ(lse - s)
        return out * torch.sigmoid(lse - sink[None, :, None].to(lse.dtype)).unsqueeze(-1).to(out.dtype)


def with_decay(score_mod: ScoreMod | None, c: Tensor | None) -> ScoreMod | None:
    """score_mod + c_i - c_j, looked up in the captured (B, H, T) cumulative log-decays c (their
    gradient flows through the capture, as a bias table's does)."""
    if c is None:
        return score_mod

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if score_mod is not None:
            score = score_mod(score, b, h, q_idx, kv_idx)
        return score + (c[b, h, q_idx] - c[b, h, kv_idx])

    return mod
