"""The bench's batch, and what its masks hide: documents (``bench.document_length``) and the
layout's windows make attention sparse, and FlexAttention skips the blocks they hide on CUDA."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from posenc.build import build_layout
from posenc.data.batches import Batch
from posenc.nn.mask import AttentionMask, document_positions


def bench_batch(vocab: int, batch_size: int, seq_len: int, document_length: int | None) -> Batch:
    """Random tokens (B, T); with document_length, every window packs documents of that many
    tokens (each row's cuts shifted, so rows differ), as dataset.packing=documents would."""
    window = torch.randint(vocab, (batch_size, seq_len + 1))
    if not document_length:
        return Batch(window[:, :-1], window[:, 1:])
    shift = torch.arange(batch_size)[:, None] * max(1, document_length // max(2, batch_size))
    doc = (torch.arange(seq_len)[None, :] + shift) // document_length
    doc = doc - doc[:, :1]  # (B, T) ids from 0 in each window
    return Batch(window[:, :-1], window[:, 1:], pos=document_positions(doc), doc=doc, length=seq_len)


def mask_summary(cfg: DictConfig, batch: Batch, device: torch.device) -> list[dict]:
    """Per distinct layer mask: its layers, the fraction of the causal scores it hides (what
    documents and windows save over plain causal attention), and on CUDA the percentage of
    FlexAttention blocks the kernel skips (BlockMask.sparsity, causal ones included)."""
    layout = build_layout(cfg)
    T = batch.x.shape[1]
    out = []
    for kind, window in layout.windows.items():
        if kind not in layout.kinds:
            continue
        mask = AttentionMask(T, None if batch.doc is None else batch.doc.to(device), window)
        causal = T * (T + 1) / 2 * batch.x.shape[0]
        row = {"kind": kind, "layers": layout.kinds.count(kind), "window": window.describe(),
               "documents": batch.doc is not None,
               "hidden_fraction": 1.0 - float(mask.visible(device=device).expand(batch.x.shape[0], -1, -1, -1).sum()) / causal}
        if device.type == "cuda":
            row["blocks_skipped_pct"] = float(mask.block_mask(device).sparsity())
        out.append(row)
    return out
