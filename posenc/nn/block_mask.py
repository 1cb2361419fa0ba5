"""FlexAttention's BlockMask of a layer's mask, built from block bounds instead of the T x T mask.

``create_block_mask`` evaluates the mask_mod at every (query, key) pair: a (B, T, T) boolean and
its index tensors, 2.6 GB and 1.8 s for one sequence of 16,384 tokens (ALiBi's 16x evaluation of
``model=small`` on an H200, where NoPE's took 0.3 GB). Every mask posenc builds (causal ∧ same
document ∧ a sliding or chunked window, posenc/nn/mask.py) shows query i one contiguous run of keys
lo_i..i, and lo_i never decreases along the window (a document's first token, i - size + 1, a
chunk's first token: each is non-decreasing in i). So a block of queries Q = [q0, q1] and a block of
keys K = [k0, k1] (128 each, FlexAttention's sparse block) are

- visible somewhere iff the first query that can reach K, i* = max(q0, k0) <= q1, has lo_{i*} <= k1
  (the smallest lo among the queries at or after k0);
- visible everywhere (a "full" block, whose mask_mod the kernel skips) iff every query of Q is at or
  after every key of K (q0 >= k1) and the last query's lo_{q1} <= k0; a block that runs past T
  (padding) is never full, as in ``create_block_mask``.

That is O(B · (T/128)²) work and memory, and the BlockMask equals ``create_block_mask``'s
(tests/test_masks.py holds them equal, torch's as the reference).
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

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
