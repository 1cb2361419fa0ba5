"""What an encoding's hooks are given, and the types they return.

``Context`` is built once per forward by the model and handed to every hook; the callables'
shapes (``ScoreMod``, ``Normaliser``, ``ScoreRows``) are what attention asks of a hook; the forms
derived from a relative bias's ``distance_bias``: ``distance_position_bias`` (the dense bias) and
``distance_score_mod`` (with ``positions_at``, FlexAttention's). The contract itself is
posenc/nn/encodings/base.py, which re-exports all of these (and ``KernelUnavailable``, what an encoding's
own kernel raises when it cannot run: posenc/nn/failures.py).

Vocabulary, one name per concept:
    position_bias  b_h(i, j), the (..., H, Tq, Tk) logit term computed from positions alone;
    distance_bias  b_h(n) over distances n = i - j, for a position bias that depends on positions
                   only through i - j: the one form a relative bias writes, the others derived;
    score_mod      the bias as a FlexAttention function of (score, b, h, q_idx, kv_idx);
    content_bias   a logit term computed from q and k in each layer;
    qk_scores      s_ij replacing q_i·k_j (before the 1/√d and every additive term), in row blocks;
    decay          cumulative log forget gates c, a logit term c_i - c_j in each layer;
    logit scale    τ_i multiplying q_i·k_j/√d (additive terms are added unscaled);
    sink           a logit s_h of a key with zero value that every query sees;
    normaliser     what turns a row of logits into weights: softmax unless replaced;
    fused_attention a kernel of the encoding's own computing a layer's whole attention (fla's FoX,
                   PaTH and stick-breaking kernels), equal to what the other hooks define.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn.failures import KernelUnavailable  # noqa: F401 - the contract's, re-exported
from posenc.nn.mask import GLOBAL, AttentionMask

#: FlexAttention's score_mod signature: (score, batch, head, q_idx, kv_idx) -> score
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
#: a replacement for softmax: (scores (B, H, Tq, Tk) with -inf on hidden keys, q_idx (Tq,),
#: k_idx (Tk,) window indices of those queries and keys) -> weights (B, H, Tq, Tk)
Normaliser = Callable[[Tensor, Tensor, Tensor], Tensor]

#: a layer's scores s_ij in row blocks: rows(start, end, lo) -> (B, H, end - start, end - lo), the
#: queries start..end-1 over the keys lo..end-1 (window indices), so that long sequences never hold T x T
ScoreRows = Callable[[int, int, int], Tensor]
#: a layer's whole attention by a kernel of the encoding's own: (q, k, v, ctx, layer, log_gates) -> (B, H, T, dv).
#: q, k: (B, H, T, d) after transform_qk and the logit scale; v: (B, H, T, dv); ctx: with the block's input x
#: and the layer's mask; log_gates: (B, H, T) per-token log forget gates g_t of a wrapping mechanism, whose sums
#: Σ_{t=j+1..i} g_t join the logits unscaled (FoX's decays), or None
FusedAttention = Callable[[Tensor, Tensor, Tensor, "Context", int, "Tensor | None"], Tensor]


@dataclass(frozen=True)
class Context:
    """What every hook may know about one forward pass, built once by the model.

    pos: the tokens' positions, (T,) shared by the batch (the fast common case) or (B, T) per
    sequence (dataset.packing=documents: positions restart at 0 at every document); length:
    largest position + 1, a Python int (so no hook ever synchronises with the device to learn
    it); default_positions: pos is 0..T-1, which lets a fused kernel compute a relative bias
    from q_idx - kv_idx with no gather; doc: (B, T) document ids within each window, or None
    (one document per window); masks: each layer's attention mask (posenc/nn/mask.py), empty
    when every layer is causal over the whole window; x: the input of the block whose hooks are
    being called, (B, T, d_model) after its norm, set by the block (``with_input``) and None in
    the per-forward context (``embed``, the plans).
    """

    pos: Tensor
    n_positions: int
    default_positions: bool = True
    dtype: torch.dtype = torch.float32
    doc: Tensor | None = None
    masks: tuple[AttentionMask, ...] = ()
    x: Tensor | None = None

    @classmethod
    def arange(cls, T: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
               doc: Tensor | None = None, masks: tuple[AttentionMask, ...] = ()) -> Context:
        """The default context: positions 0..T-1."""
        return cls(torch.arange(T, device=device), T, True, dtype, doc, masks)

    @classmethod
    def at(cls, pos: Tensor, dtype: torch.dtype = torch.float32, doc: Tensor | None = None,
           masks: tuple[AttentionMask, ...] = (), n_positions: int | None = None) -> Context:
        """A context for explicit positions, (T,) or (B, T). ``n_positions`` (>= max(pos) + 1)
        is the bound the caller knows; without it, one host sync for the maximum."""
        if n_positions is None:
            n_positions = int(pos.max()) + 1 if pos.numel() else 0
        return cls(pos, n_positions, False, dtype, doc, masks)

    @property
    def device(self) -> torch.device:
        return self.pos.device

    @property
    def T(self) -> int:
        """The window's width: the number of tokens in each sequence (not n_positions, which is
        the largest position + 1 and differs from T under documents packing or shifted positions)."""
        return self.pos.shape[-1]

    @property
    def per_sequence(self) -> bool:
        """Positions differ between the sequences of the batch: pos is (B, T)."""
        return self.pos.dim() == 2

    def mask(self, layer: int = 0) -> AttentionMask:
        """The attention mask of block ``layer``: causal (within documents) when the model set none."""
        return self.masks[layer] if layer < len(self.masks) else AttentionMask(self.T, self.doc, GLOBAL)

    def with_input(self, x: Tensor) -> Context:
        """The same forward, inside a block whose (normed) input is x: (B, T, d_model)."""
        return dataclasses.replace(self, x=x)

    def at_indices(self) -> Context:
        """The same forward with positions 0..T-1: what a bias that depends on positions only
        through i - j sees under document masking, where i - j inside a document is the
        difference of the window indices and pairs across documents are masked anyway."""
        return dataclasses.replace(Context.arange(self.T, self.device, self.dtype, self.doc, self.masks), x=self.x)


def distance_position_bias(distance_bias: Callable[[Tensor], Tensor], q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """b_h(i, j) = distance_bias(i - j)_h: queries q_pos (..., Tq), keys k_pos (..., Tk) -> (..., H, Tq, Tk).

    distance_bias is asked once, at every pair's distance (flattened), so the bias is exact at any
    positions with no host sync to size a table, and costs what the pairs cost: (..., Tq, Tk)
    distances beside the (..., H, Tq, Tk) bias (the chunked path asks for a slice of queries at a
    time). The future (j > i) is masked by the caller; its distance is clamped to 0 only so that
    it stays in distance_bias's domain n >= 0."""
    distance = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0)  # (..., Tq, Tk)
    return distance_bias(distance.flatten()).unflatten(-1, distance.shape).movedim(0, -3)  # (H, ...) -> (..., H, Tq, Tk)


def distance_score_mod(table: Tensor, pos: Tensor | None) -> ScoreMod:
    """score + table[h, i - j]: a per-head bias over relative distance, looked up per score.

    table: (H, R); pos: (T,) or (B, T) positions, or None for the default 0..T-1, where i - j
    is q_idx - kv_idx itself and no gather through a positions tensor is needed. The future
    (j > i) is masked by the caller's BlockMask; its distance is clamped to 0 only so that
    the lookup stays in range."""

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qi, kj = positions_at(pos, b, q_idx, kv_idx)
        return score + table[h, (qi - kj).clamp(min=0)]

    return mod


def positions_at(pos: Tensor | None, b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> tuple[Tensor, Tensor]:
    """Inside a score_mod: the positions of query q_idx and key kv_idx of sequence b: the
    indices themselves (pos None: 0..T-1), a lookup in (T,) or in (B, T) positions."""
    if pos is None:
        return q_idx, kv_idx
    if pos.dim() == 1:
        return pos[q_idx], pos[kv_idx]
    return pos[b, q_idx], pos[b, kv_idx]
