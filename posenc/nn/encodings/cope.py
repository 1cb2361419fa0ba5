"""CoPE, contextual position encoding (Golovneva et al., 2024, "Contextual Position Encoding:
Learning to Count What's Important", §3 and the code in its appendix).

Positions are counted in context, not in tokens: query i decides, key by key, whether key t
counts (a gate), and the position of key j relative to query i is the number of counted keys
from j to i:

    g_it = σ(q_i·k_t / √d)                   gates, for keys t <= i only (causal)
    p_ij = Σ_{t=j..i} g_it                   a fractional position in [0, i - j + 1]
    e[p] = (1 - w)·e[⌊p⌋] + w·e[⌈p⌉],  w = p - ⌊p⌋   learned e[n] interpolated
    a_ij = softmax_j(q_i·k_j / √d + q_i·e[p_ij])

As the paper's code does, the interpolation is done on the logits rather than on e: z_i[p] =
q_i·e[p] is computed for every integer p (one (T, d) x (d, npos_max) matmul per head) and
q_i·e[p_ij] = (1 - w)·z_i[⌊p_ij⌋] + w·z_i[⌈p_ij⌉], w = p_ij - ⌊p_ij⌋, which is the same by
linearity and never materialises a (T, T, d) tensor. Positions are clamped to npos_max - 1.

**Logit scale.** The paper's code divides q·k by √d *before* taking the gates from those
logits, and adds q·e[p] to the already-scaled logits *unscaled*. SDPA computes
softmax(q·kᵀ/√d + mask), adding the float mask after its own 1/√d, so ``content_bias`` returns
q·e[p] as it is and computes the gates from q·k/√d: the same logits as the paper's code.

**Parameters and their scale.** One table e of npos_max vectors of size head_dim per layer
(each layer of the paper's code owns its CoPE), shared by the heads as the paper's code shares
it (its heads are folded into the batch), or one per head with ``per_head: true``. It starts at
zero, as in the paper, and is used unscaled: the logit term q·e[p] is a sum over head_dim
products, so one Adam step (each entry moving by about lr) moves it by about lr·Σ_d |q_d|,
head_dim·|q_d| times what it moves one scalar of a bias table (T5), which is what lets it reach
logit-sized values within posenc's budgets with no extra scale (measured at 2 layers, d=128,
4 heads, T=64, 400 steps, lr 2e-3: the std of q·e[p] over visible pairs is 2.4 and 1.7 in the two
layers, next to 2.1 and 1.6 for q·k/√d; max |e| = 0.23). Training reaches the entries e[n]
up to the largest p it produces, and a window of L tokens produces p_ij <= i - j + 1 <= L: the
default npos_max = L (null: the training length) holds no entry a training window cannot reach (how
far the gates actually go is learned: p reached 60 of 63 in the run above), and beyond L the
positions are clamped to the last entry rather than read from entries no window produced.

**Cost.** The term depends on q and k, so it is dense: B·H·T² floats per layer, added to
SDPA's float mask on CPU and CUDA alike. Long sequences are processed in chunks of queries
(each chunk sees every key) so that the intermediates stay near ``CHUNK_ELEMENTS`` floats.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.nn.cumsum import cumsum
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import KeysAtPositions, LayerCache
from posenc.nn.mask import AttentionMask, Window

#: query rows per chunk are chosen so that one (B, H, rows, T) intermediate holds about this many floats
CHUNK_ELEMENTS = 2**24


def contextual_positions(gates: Tensor) -> Tensor:
    """p_ij = Σ_{t=j..i} g_it: gates (..., Tq, Tk), zero on future keys -> (..., Tq, Tk).

    A cumulative sum over keys from the last one back (the paper's flip-cumsum-flip); future
    keys have g = 0, so the sum from j to the end is the sum from j to i."""
    return cumsum(gates, -1, reverse=True)


def interpolated_logits(z: Tensor, p: Tensor) -> Tensor:
    """q_i·e[p_ij] from the integer-position logits z_i[n] = q_i·e[n].

    z: (..., Tq, npos), p: (..., Tq, Tk) fractional positions in [0, npos - 1]
    -> (1 - w)·z_i[⌊p_ij⌋] + w·z_i[⌈p_ij⌉], w = p_ij - ⌊p_ij⌋ (differentiable in p through w)."""
    floor, ceil = p.floor(), p.ceil()
    w = p - floor
    return z.gather(-1, ceil.long()) * w + z.gather(-1, floor.long()) * (1 - w)


class CoPE(PositionalEncoding):
    """Contextual positions from sigmoid gates on q·k; a learned e[p] per layer added as q·e[p]."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        n_layer: int,
        name: str = "cope",
        npos_max: int | None = None,
        per_head: bool = False,
        train_len: int | None = None,
    ) -> None:
        """npos_max: entries of each table e; None: the training length ``train_len`` (64 without one)."""
        super().__init__(d_model, n_head, name)
        npos_max = npos_max if npos_max is not None else (train_len if train_len is not None else 64)
        if n_layer <= 0:
            raise ValueError(f"model.n_layer must be positive, got {n_layer}")
        if npos_max < 1:
            raise ValueError(f"encoding.npos_max must be >= 1 (positions are clamped to npos_max - 1), got {npos_max}")
        self.npos_max = int(npos_max)
        self.per_head = bool(per_head)
        # e: (layer, heads sharing it or each head, head_dim, npos_max), zero as in the paper's code
        self.pos_emb = nn.Parameter(torch.zeros(n_layer, n_head if per_head else 1, self.head_dim, self.npos_max))

    def gates(self, q: Tensor, k: Tensor, hidden: Tensor) -> Tensor:
        """g_it = σ(q_i·k_t/√d), 0 where key t is hidden from query i (the future, another
        document, outside the layer's window): (B, H, Tq, d), (B, H, Tk, d), hidden bool
        broadcastable to (B, H, Tq, Tk) -> (B, H, Tq, Tk)."""
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.sigmoid(logits).masked_fill(hidden, 0.0)

    def positions(self, q: Tensor, k: Tensor, hidden: Tensor) -> Tensor:
        """p_ij clamped to npos_max - 1: (B, H, Tq, Tk)."""
        return contextual_positions(self.gates(q, k, hidden)).clamp(max=self.npos_max - 1)

    def cope_logits(self, q: Tensor, k: Tensor, e: Tensor, hidden: Tensor) -> Tensor:
        """q_i·e[p_ij] for queries q (B, H, Tq, d) against keys k (B, H, Tk, d) -> (B, H, Tq, Tk)."""
        z = q @ e  # (B, H, Tq, d) @ (1|H, d, npos) -> (B, H, Tq, npos): q_i·e[n] for every integer n
        return interpolated_logits(z, self.positions(q, k, hidden))

    def content_bias(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> Tensor:
        """q, k: (B, H, T, d) -> (B, H, T, T) in float32 (or float64 for float64 inputs), the term
        q_i·e[p_ij] added to q·k/√d."""
        B, H, T, _ = q.shape
        mask = ctx.mask(layer)  # gates count only the keys this layer's query can see
        rows = max(1, CHUNK_ELEMENTS // max(1, B * H * T))
        if rows >= T:
            return self.contextual_logits(q, k, layer, ~mask.visible(device=q.device))
        out = q.new_empty(B, H, T, T, dtype=torch.promote_types(q.dtype, torch.float32))
        for start in range(0, T, rows):  # long evaluation: a slice of queries at a time
            end = min(start + rows, T)
            hidden = ~mask.visible(start, end, 0, T, device=q.device)  # (B|1, 1, rows, T)
            out[:, :, start:end] = self.contextual_logits(q[:, :, start:end], k, layer, hidden)
        return out

    def contextual_logits(self, q: Tensor, k: Tensor, layer: int, hidden: Tensor) -> Tensor:
        """q_i·e[p_ij] of queries q (B, H, Tq, d) against keys k (B, H, Tk, d), hidden (B|1, 1, Tq, Tk) the
        keys each query does not see -> (B, H, Tq, Tk), in at least float32 even under autocast (the
        cumulative sum runs over up to Tk gates)."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            return self.cope_logits(q.to(dtype), k.to(dtype), self.pos_emb[layer].to(dtype), hidden)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The keys and values, and for each new query its contextual positions recounted over the kept
        keys: p_ij = Σ_{t=j..i} σ(q_i·k_t/√d) sums gates of the query's own, so nothing of an earlier
        query's count is reusable (O(T·d) a token, as the full forward's row)."""
        return Recounted(self, layer, window, self)

    def options(self) -> dict[str, object]:
        return {"npos_max": self.npos_max, "per_head": self.per_head}


class Recounted(KeysAtPositions):
    """CoPE's keys and values; a new query's term q_i·e[p_ij] is computed against every kept key, its gates
    recounted (``CoPE.contextual_logits``) over the keys its layer's mask shows it."""

    keeps = "keys, values (contextual positions recounted per query)"

    def __init__(self, encoding: PositionalEncoding, layer: int, window: Window, cope: CoPE) -> None:
        super().__init__(encoding, layer, window)
        self.cope = cope

    def content(self, q: Tensor, n0: int) -> Tensor | None:
        n1 = self.length
        hidden = ~AttentionMask(n1, None, self.window).visible(n0, n1, self.start, n1, device=q.device)
        return self.cope.contextual_logits(q, self.keys, self.layer, hidden)
