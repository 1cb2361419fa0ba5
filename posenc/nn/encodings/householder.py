"""Products of Householder-like transforms between key and query, chunk by chunk (PaTH's algorithm).

PaTH's logit of query i and key j is the bilinear form

    s_ij = q_iᵀ H_i H_{i-1} ··· H_{j+1} k_j,      H_t = I - β_t w_t w_tᵀ        (j <= i)

(H_j itself is not in the product: key j is carried through the transforms of the tokens after it,
up to and including the query's own, as fla's decoding step updates its cache: k <- H_t k).

Writing the T x T products out costs O(T² d²); the paper's algorithm instead cuts the sequence into
chunks of C tokens and represents each chunk's product in the UT (compact WY) form. With W the
chunk's w_t as rows, D = diag(β) and L = strict_lower(W Wᵀ) D, carrying a vector x through the
chunk's transforms in order is

    x -> x - Wᵀ D y,   y = (I + L)⁻¹ W x          (y_t = w_t·(x after H_0..H_{t-1}))

so the chunk's whole product is P = I - Wᵀ D (I + L)⁻¹ W, and one unit-lower-triangular inverse per
chunk gives everything else:

    b_j = key j carried to its chunk's end          K - Yᵀ D W,   Y = (I + L)⁻¹ strict_lower(W Kᵀ)
    a_i = query i carried back to its chunk's start  Q - tril(Q Wᵀ) D (I + L)⁻¹ W
    s_ij inside a chunk                              tril(Q Kᵀ) - tril(Q Wᵀ) D Y

and a key in an earlier chunk m < n is reached by a_iᵀ P_{n-1} ··· P_{m+1} b_j: the query's row
vector goes back one chunk at a time (r <- r - r Wᵀ D (I + L)⁻¹ W). Memory stays O(T·(C + d)) plus
the scores asked for; ``PathScores.rows`` computes a block of query rows, so a long sequence never
holds T x T.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: tokens per chunk of the UT representation (fla's kernels use 32-128)
CHUNK = 64


def householder_chunks(w: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """The UT representation of each chunk's transforms: w (..., N, C, d), β (..., N, C) ->
    (I + L)⁻¹ (..., N, C, C), unit lower triangular, and Z = (I + L)⁻¹ W (..., N, C, d)."""
    C = w.shape[-2]
    strict = torch.ones(C, C, dtype=torch.bool, device=w.device).tril(-1)
    eye = torch.eye(C, dtype=w.dtype, device=w.device)
    # L_ts = β_s w_t·w_s for s < t
    system = eye + (w @ w.transpose(-1, -2) * beta[..., None, :]).masked_fill(~strict, 0.0)
    inverse = unit_lower_inverse(system)
    return inverse, inverse @ w


def unit_lower_inverse(system: Tensor) -> Tensor:
    """(I + L)⁻¹ of a unit lower triangular (..., C, C), by doubling blocks: with the inverses A⁻¹,
    D⁻¹ of two adjacent diagonal blocks, [[A, 0], [E, D]]⁻¹ = [[A⁻¹, 0], [-D⁻¹ E A⁻¹, D⁻¹]]. Every
    intermediate is the inverse of a sub-chunk (bounded, unlike a Neumann series), log₂ C batched
    steps; torch's batched triangular solve is far slower on CPU for many small systems."""
    *lead, C, _ = system.shape
    size = 1 << max(C - 1, 0).bit_length()  # the next power of two: pad with the identity
    if size != C:
        padded = torch.eye(size, dtype=system.dtype, device=system.device).expand(*lead, size, size).clone()
        padded[..., :C, :C] = system
        system = padded
    inverse = torch.ones(*lead, size, 1, 1, dtype=system.dtype, device=system.device)  # (..., n, b, b): b = 1
    b = 1
    while b < size:
        n = size // (2 * b)
        blocks = system.reshape(*lead, n, 2 * b, n, 2 * b).diagonal(dim1=-4, dim2=-2).movedim(-1, -3)  # (..., n, 2b, 2b)
        a_inv, d_inv = inverse[..., 0::2, :, :], inverse[..., 1::2, :, :]  # (..., n, b, b)
        off = -d_inv @ blocks[..., b:, :b] @ a_inv
        top = torch.cat((a_inv, torch.zeros_like(a_inv)), dim=-1)
        inverse = torch.cat((top, torch.cat((off, d_inv), dim=-1)), dim=-2)  # (..., n, 2b, 2b)
        b *= 2
    return inverse[..., 0, :C, :C]


class PathScores:
    """s_ij = q_iᵀ H_i ··· H_{j+1} k_j for every query and earlier key, computed in row blocks.

    q, k, w: (B, H, T, d); β: (B, H, T). The chunks' representations are computed once here
    (O(T·(C + d)) memory); ``rows`` computes the scores of a block of queries."""

    def __init__(self, q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int | None = None) -> None:
        self.T = q.shape[-2]
        self.C = C = min(chunk or CHUNK, self.T)
        pad = (-self.T) % C  # zero w and β at the end: H = I there, and nothing earlier sees them
        if pad:  # (no pad of 0: torch 2.7's compiled pad of 0 returns its strided input where it promised a copy)
            q, k, w = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, w))
            beta = torch.nn.functional.pad(beta, (0, pad))
        *lead, Tp, d = q.shape
        q, k, w = (t.reshape(*lead, Tp // C, C, d) for t in (q, k, w))  # (B, H, N, C, d)
        beta = beta.reshape(*lead, Tp // C, C)  # (B, H, N, C)
        inverse, z = householder_chunks(w, beta)
        incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()  # [i, t]: t <= i
        qw = (q @ w.transpose(-1, -2)).masked_fill(~incl, 0.0)  # (B, H, N, C, C): q_i·w_t, t <= i
        wk = (w @ k.transpose(-1, -2)).masked_fill(incl.T, 0.0)  # w_t·k_j for t > j: the transforms after key j
        y = inverse @ wk  # (B, H, N, C, C): y_tj, zero for t <= j
        bw = beta[..., None] * w  # D W
        self.local = (q @ k.transpose(-1, -2)).masked_fill(~incl, 0.0) - qw @ (beta[..., None] * y)  # (B, H, N, C, C)
        self.b = k - y.transpose(-1, -2) @ bw  # (B, H, N, C, d): keys carried to their chunk's end
        self.a = q - qw @ (beta[..., None] * z)  # (B, H, N, C, d): queries carried back to their chunk's start
        self.p = w.transpose(-1, -2) @ (beta[..., None] * z)  # (B, H, N, d, d): P_n = I - p_n

    @property
    def n_chunks(self) -> int:
        return self.a.shape[-3]

    def rows(self, start: int, end: int, lo: int) -> Tensor:
        """s for queries start..end-1 over keys lo..end-1: (B, H, end - start, end - lo); zero where
        j > i (the mask hides those keys). In at least float32 under any autocast."""
        with torch.autocast(self.a.device.type, enabled=False):
            return self.scan(start, end, lo)

    def scan(self, start: int, end: int, lo: int) -> Tensor:
        """``rows``: each query chunk's rows go back one key chunk per step, all query chunks at once."""
        C = self.C
        n0, n1, m0 = start // C, math.ceil(end / C), lo // C
        blocks: list[list[Tensor]] = [[] for _ in range(n0, n1)]  # blocks[n - n0]: key chunks m0..n
        state = self.a[..., n0:n1, :, :]  # (B, H, nq, C, d): query rows, carried back chunk by chunk
        first = n0  # the query chunk state[..., 0] belongs to
        for distance in range(0, n1 - m0):
            if distance == 0:
                for n in range(n0, n1):
                    blocks[n - n0].append(self.local[..., n, :, :])
                continue
            keep = max(n0, m0 + distance)  # query chunks n that still have a key chunk n - distance >= m0
            state = state[..., keep - first:, :, :]
            first = keep
            m_lo, m_hi = keep - distance, n1 - distance  # key chunks m = n - distance, a contiguous range
            scores = state @ self.b[..., m_lo:m_hi, :, :].transpose(-1, -2)  # (B, H, n, C, C)
            for n in range(keep, n1):
                blocks[n - n0].append(scores[..., n - keep, :, :])
            state = state - state @ self.p[..., m_lo:m_hi, :, :]  # r <- r P_m: one chunk further back
        return self.assemble(blocks, n0, n1, m0)[..., start - n0 * C:end - n0 * C, lo - m0 * C:end - m0 * C]

    def assemble(self, blocks: list[list[Tensor]], n0: int, n1: int, m0: int) -> Tensor:
        """Row blocks of (C, C) score blocks, nearest key chunk first -> (B, H, rows, keys), zero
        on key chunks after the query's."""
        rows = []
        for n, row in zip(range(n0, n1), blocks):
            past = row[:0:-1] + row[:1]  # key chunks m0..n-1 (collected nearest first), then n itself
            future = n1 - 1 - n
            if future:
                past.append(row[0].new_zeros(*row[0].shape[:-1], future * self.C))
            rows.append(torch.cat(past, dim=-1))
        return torch.cat(rows, dim=-2)


def carried_to_end(k: Tensor, w: Tensor, beta: Tensor, chunk: int | None = None) -> Tensor:
    """Every key carried through the transforms of the tokens after it: H_{T-1} ··· H_{j+1} k_j for each
    key j, k (B, H, T, d), w (B, H, T, d), β (B, H, T) -> (B, H, T, d). What PaTH's decoding keeps of a
    prompt, so that a new query i meets q_iᵀ H_i (H_{T-1} ··· H_{j+1} k_j) (fla's decoding step applies
    each new token's transform to its key cache). Chunk by chunk: b_j, each key carried to its chunk's
    end (``PathScores``), then through the product of every later chunk, P_{N-1} ··· P_{m+1}, accumulated
    from the last chunk back (d x d per chunk: O(T·d² + T/C·d³))."""
    chunks = PathScores(k, k, w, beta, chunk)
    b, p = chunks.b, chunks.p  # (B, H, N, C, d), (B, H, N, d, d): P_m = I - p_m
    eye = torch.eye(b.shape[-1], dtype=b.dtype, device=b.device)
    out = torch.empty_like(b)
    after = None  # P_{m+1}ᵀ ··· P_{N-1}ᵀ: what carries a row vector from chunk m's end to the last token
    for m in range(b.shape[-3] - 1, -1, -1):
        out[..., m, :, :] = b[..., m, :, :] if after is None else b[..., m, :, :] @ after
        later = eye - p[..., m, :, :].transpose(-1, -2)
        after = later if after is None else later @ after
    return out.flatten(-3, -2)[..., : k.shape[-2], :]
