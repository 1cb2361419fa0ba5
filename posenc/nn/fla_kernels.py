"""flash-linear-attention's chunked Triton kernels for the recurrent layer kinds, on CUDA.

Optional (``pip install posenc[fla]``): without fla, or off CUDA, the recurrent layers use the
chunked PyTorch form (posenc/nn/recurrence.py), which computes the same thing. fla takes
(B, T, H, d) tensors and, for packed documents, one flattened sequence with ``cu_seqlens`` (the
offsets where each document starts): the same reset of the state at every document.
"""

from __future__ import annotations

import functools
import importlib

import torch
from torch import Tensor

from posenc.nn.attention import warn_once


@functools.cache
def _ops() -> tuple | None:
    """(chunk_gated_delta_rule, chunk_simple_gla), or None when fla (or Triton) is not installed."""
    try:
        gdr = importlib.import_module("fla.ops.gated_delta_rule")
        gla = importlib.import_module("fla.ops.simple_gla")
    except ImportError:
        return None
    return gdr.chunk_gated_delta_rule, gla.chunk_simple_gla


def usable(device: torch.device) -> bool:
    """Whether fla's kernels run here: a CUDA device and fla importable (one warning if not)."""
    if device.type != "cuda":
        return False
    if _ops() is None:
        warn_once("recurrent layers run the chunked PyTorch recurrence on CUDA: flash-linear-attention is not "
                  "installed (pip install 'posenc[fla]' for its kernels)")
        return False
    return True


def cu_seqlens(seg: Tensor) -> Tensor:
    """seg (B, T) segment ids -> the offsets of every segment of the flattened (1, B·T) sequence,
    ending with B·T (fla's convention); every window starts a segment too."""
    B, T = seg.shape
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    offsets = starts.flatten().nonzero().flatten()
    return torch.cat((offsets, offsets.new_tensor([B * T]))).to(torch.int32 if B * T < 2**31 else torch.int64)


def mix(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, seg: Tensor | None) -> Tensor:
    """The recurrence through fla: q, k (B, H, T, dk) (q already scaled), v (B, H, T, dv), g, beta
    (B, H, T) -> (B, H, T, dv)."""
    gated_delta_rule, simple_gla = _ops()
    B, H, T, _ = q.shape
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, T, H, d)
    g = g.transpose(1, 2).float()  # (B, T, H)
    offsets = None
    if seg is not None:  # documents: one flattened sequence, the state reset at each offset
        q, k, v, g = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, g))
        offsets = cu_seqlens(seg)
    if beta is not None:
        beta = beta.transpose(1, 2).reshape(g.shape).to(q.dtype)
        o, _ = gated_delta_rule(q, k, v, g, beta, scale=1.0, cu_seqlens=offsets)
    else:
        o, _ = simple_gla(q, k, v, g, scale=1.0, cu_seqlens=offsets)
    return o.reshape(B, T, H, -1).transpose(1, 2)
