"""Which keys each query may see: causal, within its document, within a window, per layer.

The mask is part of the experiment, beside the encoding. One layer's mask is the conjunction of

- causal: key j is visible to query i only if j <= i (token order in the window);
- document (``doc`` given, dataset.packing=documents): only if both tokens belong to the same
  document of the packed window (torchtitan's ``block_causal``, Llama 3's pretraining);
- a window of ``size`` tokens (a layer kind of the layout, posenc/nn/layout.py):
  sliding, i - j < size (Mistral, Gemma 2/3's local layers, GPT-OSS's banded layers: the query
  and the size - 1 keys before it), or chunked, ⌊i / size⌋ = ⌊j / size⌋ (Llama 4's chunked
  local attention: the window restarts every ``size`` tokens).

Each piece is a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` (attention-gym's style), composed
with ``and_masks``; on CUDA the conjunction becomes a ``BlockMask`` that lets the kernel skip
fully masked blocks, and on CPU the same conjunction is a boolean matrix (``visible``), computed
for a slice of queries at a time where sequences are long. Every query sees at least itself, so
no row is ever fully masked.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn import torch_private

#: FlexAttention's mask_mod signature: (batch, head, q_idx, kv_idx) -> bool
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Window:
    """The span of a layer's attention. size None: the whole causal past (a global layer)."""

    size: int | None = None
    chunked: bool = False  # chunks of `size` tokens (Llama 4) instead of a sliding band (Mistral)

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 1:
            raise ValueError(f"an attention window must hold at least 1 token, got {self.size}")

    def limits(self, T: int) -> bool:
        """Whether it hides anything from a query in a sequence of T tokens."""
        return self.size is not None and self.size < T

    def first_key(self, i: int) -> int:
        """The first key query i sees in a sequence that starts at 0 (one document): i - size + 1 for
        a sliding window, the start of i's chunk for a chunked one, 0 for a global layer. A key before
        it is seen by no later query either, so a decoding cache drops it (posenc/nn/encodings/cache.py)."""
        if self.size is None:
            return 0
        return (i // self.size) * self.size if self.chunked else max(0, i - self.size + 1)

    def describe(self) -> str:
        if self.size is None:
            return "global"
        return f"{'chunk' if self.chunked else 'sliding'} {self.size}"


GLOBAL = Window()


# --- mask_mods ---------------------------------------------------------------------------
def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Key j is visible to query i iff j <= i."""
    return q_idx >= kv_idx


def sliding(size: int) -> MaskMod:
    """The query and the size - 1 keys before it: i - j < size."""

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx - kv_idx < size

    return mod


def chunk(size: int) -> MaskMod:
    """The same chunk of `size` tokens: ⌊i / size⌋ = ⌊j / size⌋."""

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx // size == kv_idx // size

    return mod


def document(doc: Tensor) -> MaskMod:
    """The same document: doc (B, T) holds each token's document id within its window."""

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return doc[b, q_idx] == doc[b, kv_idx]

    return mod


def and_masks(*mods: MaskMod) -> MaskMod:
    """The conjunction of mask_mods (FlexAttention's own ``and_masks`` where it exists)."""
    try:
        from torch.nn.attention.flex_attention import and_masks as flex_and
    except ImportError:  # torch < 2.5
        flex_and = None
    if flex_and is not None:
        return flex_and(*mods)

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out & m(b, h, q_idx, kv_idx)
        return out

    return mod


# --- one layer's mask in one forward ----------------------------------------------------
@dataclass(frozen=True, eq=False, init=False)
class AttentionMask:
    """causal ∧ same document (when ``doc`` is given) ∧ the window, for a sequence of T tokens.

    doc: (B, T) long document ids within each window, or None (one document per window);
    window: the layer's span, None for GLOBAL.
    """

    T: int
    doc: Tensor | None
    window: Window

    def __init__(self, T: int, doc: Tensor | None = None, window: Window | None = None) -> None:
        # written out so that no default is a Window: the model builds its masks inside the compiled
        # forward, where torch 2.11's dynamo wraps every default of the __init__ it inlines, given or
        # not, and cannot wrap a Window that way ("Unexpected type in sourceless builder"): one graph
        # break in every forward. None it can (torch 2.13 does not wrap the defaults it is not given)
        object.__setattr__(self, "T", T)
        object.__setattr__(self, "doc", doc)
        object.__setattr__(self, "window", GLOBAL if window is None else window)

    @property
    def causal_only(self) -> bool:
        """Nothing but causality: the fused is_causal kernels apply."""
        return self.doc is None and not self.window.limits(self.T)

    def mask_mod(self) -> MaskMod:
        mods = [causal]
        if self.window.limits(self.T):
            mods.append(chunk(self.window.size) if self.window.chunked else sliding(self.window.size))
        if self.doc is not None:
            mods.append(document(self.doc))
        return mods[0] if len(mods) == 1 else and_masks(*mods)

    def key_range(self, start: int, end: int) -> tuple[int, int]:
        """Keys [lo, end) that queries start..end-1 can see at all: a sliding window or a chunk
        hides everything before lo, so a query chunk need not touch those keys."""
        w = self.window
        if not w.limits(self.T):
            return 0, end
        lo = (start // w.size) * w.size if w.chunked else max(0, start - w.size + 1)
        return lo, end

    def visible(self, start: int = 0, end: int | None = None, k_start: int = 0, k_end: int | None = None,
                device: torch.device | None = None) -> Tensor:
        """Boolean visibility of keys k_start..k_end-1 to queries start..end-1:
        (B or 1, 1, end - start, k_end - k_start), True where the query may attend."""
        end = self.T if end is None else end
        k_end = end if k_end is None else k_end
        device = self.doc.device if self.doc is not None else device
        i = torch.arange(start, end, device=device)[:, None]  # (Tq, 1)
        j = torch.arange(k_start, k_end, device=device)[None, :]  # (1, Tk)
        out = causal(None, None, i, j)
        if self.window.limits(self.T):
            out = out & (chunk if self.window.chunked else sliding)(self.window.size)(None, None, i, j)
        if self.doc is None:
            return out[None, None]  # (1, 1, Tq, Tk)
        same = self.doc[:, start:end, None] == self.doc[:, None, k_start:k_end]  # (B, Tq, Tk)
        return (out[None] & same)[:, None]  # (B, 1, Tq, Tk)

    def visible_keys(self, device: torch.device | None = None) -> Tensor:
        """How many keys each query sees, n_i: (B or 1, T) long (SSMax's s·log n uses it).

        In closed form, O(T) rather than a T x T count (16× evaluation): every mask here shows
        query i a contiguous run of keys lo_i..i (``first_keys``)."""
        first = self.first_keys(device)
        return torch.arange(self.T, device=first.device)[None, :] - first + 1

    def first_keys(self, device: torch.device | None = None) -> Tensor:
        """lo_i, the first key query i sees: (B or 1, T) long, non-decreasing along T. Every mask here
        shows query i the contiguous run lo_i..i, where lo_i is the latest of its document's first
        token, i - size + 1 (sliding) and its chunk's first token (chunked)."""
        device = self.doc.device if self.doc is not None else device
        i = torch.arange(self.T, device=device)[None, :]  # (1, T)
        lo = torch.zeros_like(i)
        if self.doc is not None:
            lo = i - document_positions(self.doc)  # (B, T): the first token of each token's document
        w = self.window
        if w.limits(self.T):
            lo = torch.maximum(lo, (i // w.size) * w.size if w.chunked else (i - w.size + 1).clamp(min=0))
        return lo

    def block_mask(self, device: torch.device):
        """The FlexAttention BlockMask: cached per (T, window) without documents; per forward
        (one per distinct mask, shared by the layers that have it) with them. Built from each
        query's first visible key (``interval_block_mask``), never from a T x T mask."""
        if self.doc is None:
            return static_block_mask(self.T, self.window, device)
        return interval_block_mask(self.first_keys(), self.T, self.mask_mod())


# a cache lookup, not something to trace: one graph break per forward (disable_dynamo imports dynamo
# only when the lookup first runs, not at import)
@torch_private.disable_dynamo
@functools.lru_cache(maxsize=32)
def static_block_mask(T: int, window: Window, device: torch.device):
    """The BlockMask of a mask that depends on (T, window) alone, built once and reused."""
    mask = AttentionMask(T, None, window)
    return interval_block_mask(mask.first_keys(device), T, mask.mask_mod())


def document_positions(doc: Tensor) -> Tensor:
    """Each token's position inside its document segment of the window: doc (B, T) ids that
    never decrease along T -> (B, T) long, 0 at every document's first token.

    Because ids never decrease, a document starts at the first index holding its id: a binary
    search of the row for each token's own id, with no scan in the compiled forward (inductor's
    scans are what failed to compile in bf16 on an H200, posenc/nn/cumsum.py)."""
    T = doc.shape[-1]
    idx = torch.arange(T, device=doc.device).expand_as(doc)
    rows = doc.contiguous()
    start_idx = torch.searchsorted(rows, rows, right=False)  # (B, T): the first index with each token's id
    return idx - start_idx


# --- FlexAttention's BlockMask, from block bounds instead of the T x T mask -----------------
# ``create_block_mask`` evaluates the mask_mod at every (query, key) pair: a (B, T, T) boolean and
# its index tensors, 2.6 GB and 1.8 s for one sequence of 16,384 tokens (ALiBi's 16x evaluation of
# ``model=small`` on an H200, where NoPE's took 0.3 GB). Every mask posenc builds (causal ∧ same
# document ∧ a sliding or chunked window, above) shows query i one contiguous run of keys
# lo_i..i, and lo_i never decreases along the window (a document's first token, i - size + 1, a
# chunk's first token: each is non-decreasing in i). So a block of queries Q = [q0, q1] and a block of
# keys K = [k0, k1] (128 each, FlexAttention's sparse block) are
#
# - visible somewhere iff the first query that can reach K, i* = max(q0, k0) <= q1, has lo_{i*} <= k1
#   (the smallest lo among the queries at or after k0);
# - visible everywhere (a "full" block, whose mask_mod the kernel skips) iff every query of Q is at or
#   after every key of K (q0 >= k1) and the last query's lo_{q1} <= k0; a block that runs past T
#   (padding) is never full, as in ``create_block_mask``.
#
# That is O(B · (T/128)²) work and memory, and the BlockMask equals ``create_block_mask``'s
# (tests/test_masks.py holds them equal, torch's as the reference).

#: FlexAttention's sparse block (torch's _DEFAULT_SPARSE_BLOCK_SIZE)
BLOCK = 128


def block_bounds(first_key: Tensor, T: int, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """(partial, full) block masks, (B|1, 1, n, n) int32 with n = ⌈T / block⌉, from each query's
    first visible key first_key (B|1, T) (non-decreasing along T; the last visible key is the query)."""
    n = -(-T // block)
    device = first_key.device
    start = torch.arange(n, device=device) * block  # q0 and k0 of every block
    last = (start + block - 1).clamp(max=T - 1)  # q1 and k1, inside the sequence
    reach = torch.maximum(start[:, None], start[None, :])  # (n, n): i* = max(q0, k0)
    reachable = reach <= last[:, None]
    any_visible = reachable & (first_key[:, reach.clamp(max=T - 1)] <= last[None, :])  # (B, n, n)
    whole = start + block <= T  # blocks with no padding
    full = ((first_key[:, last][:, :, None] <= start[None, None, :])  # lo_{q1} <= k0
            & (start[:, None] >= last[None, :])  # q0 >= k1
            & whole[:, None] & whole[None, :])
    partial = any_visible & ~full
    return partial[:, None].to(torch.int32), full[:, None].to(torch.int32)


def ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """A (B, H, n, n) 0/1 block matrix as FlexAttention's (num_blocks (B, H, n), indices (B, H, n, n)):
    each row's visible blocks first, in increasing order."""
    counts = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort(blocks, dim=-1, descending=True, stable=True).to(torch.int32)
    return counts.contiguous(), indices.contiguous()


def interval_block_mask(first_key: Tensor, T: int, mask_mod, block: int = BLOCK):
    """The BlockMask of a mask whose query i sees keys first_key[..., i]..i, with mask_mod applied
    inside the partial blocks: first_key (B|1, T) long."""
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = block_bounds(first_key, T, block)
    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    kwargs = {"BLOCK_SIZE": block, "mask_mod": mask_mod}
    if "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters:  # torch >= 2.6
        kwargs["seq_lengths"] = (T, T)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, **kwargs)
