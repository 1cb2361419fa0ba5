"""PaTH (Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim, NeurIPS 2025, "PaTH Attention: Position
Encoding via Accumulating Householder Transformations").

RoPE's fixed rotation R^{i-j} between key j and query i is replaced by a product of data-dependent
Householder-like transforms, one per token between them:

    s_ij = q_iᵀ H_i H_{i-1} ··· H_{j+1} k_j,     H_t = I - β_t w_t w_tᵀ
    w_t = normalise(silu(ShortConv(W_w x_t)))    per head, unit length (W_w low rank)
    β_t = 2·σ(u_h·x_t + b_h)                      in (0, 2): β = 2 makes H_t a reflection
    o_i = Σ_j softmax_j(s_ij/√d) v_j

the parameterisation of the authors' layer (fla-org/flash-linear-attention, fla/layers/path_attn.py:
``w_proj`` of rank 32, a causal ``ShortConvolution`` of width 3 with SiLU, ``l2_norm`` per head,
``beta = 2·sigmoid(bt_proj(x))``). H_j is not in the product and H_i is: key j is carried through
the transforms of the tokens after it up to the query's own, as fla's decoding step updates its
key cache with each new token's transform before the token attends. With β = 0 (or w = 0) every
H_t = I and PaTH is NoPE. PaTH with FoX's forget gate (the paper's PaTH-FoX) is
``encoding=path_fox``: FoX wrapping PaTH (posenc/nn/encodings/fox.py).

s_ij cannot be written as a map of q and k alone, so PaTH is the contract's ``qk_scores`` hook:
attention writes the logits out, computed by the paper's chunked UT algorithm
(posenc/nn/encodings/householder.py) a block of queries at a time, O(T·(C + d)) beside the
scores; where fla's kernels run (CUDA; a CPU under Triton's interpreter), its fused PaTH kernel computes the whole
layer instead (``fused_attention``, posenc/nn/encodings/fla_kernels.py). Under documents packing a visible
pair never spans a boundary, so its product holds only its own document's transforms; the short
convolution does not reach across one either (fla resets it at each ``cu_seqlens`` boundary). It
wraps an encoding (``encoding.inner``, NoPE by default as in the paper) whose ``transform_qk`` runs
first.

**Parameters and their scale.** Per layer: W_w as two factors (H·d x rank)(rank x d_model) as fla's
``w_proj`` (``w_rank: null`` for one full matrix), the convolution's taps (H·d x conv_size,
Conv1d's default uniform(±1/√conv_size)), β's projection u (H x d_model) and bias b (H, zero: every
β starts at 2σ(0) = 1). The projections start N(0, init_std²); w is normalised, so their scale
only sets the step of its direction. β's bias enters as ``bias_scale · b`` (√head_dim by default,
as FoX's gate bias here): one Adam step moves b by about lr, so β's logit moves by bias_scale·lr.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn import fla_kernels
from posenc.nn.encodings.base import (
    Context,
    FusedAttention,
    PositionalEncoding,
    ScoreRows,
)
from posenc.nn.encodings.cache import KeysAtPositions, LayerCache, Rows, cat
from posenc.nn.encodings.householder import PathScores, carried_to_end
from posenc.nn.encodings.mechanism import Mechanism
from posenc.nn.mask import Window


def short_convolution(u: Tensor, taps: Tensor, doc: Tensor | None) -> Tensor:
    """A causal depthwise convolution with SiLU, restarted at every document: u (B, T, D), taps
    (D, K) with taps[:, K-1] on the token itself (Conv1d's order), doc (B, T) or None ->
    (B, T, D), y_t = silu(Σ_{s<K} taps[:, K-1-s] · u_{t-s}), u of another document counted as 0."""
    T, K = u.shape[1], taps.shape[1]
    y = u * taps[:, K - 1]
    for s in range(1, K):
        past = F.pad(u, (0, 0, s, 0))[:, :T]  # (B, T, D): u_{t-s}, zero before the window
        if doc is not None:
            same = doc == F.pad(doc, (s, 0), value=-1)[:, :T]  # (B, T): t - s in t's document
            past = past * same[..., None].to(past.dtype)
        y = y + past * taps[:, K - 1 - s]
    return F.silu(y)


class PaTH(Mechanism):
    """Accumulated Householder-like transforms between each key and query (see the module doc)."""

    def __init__(
        self,
        inner: PositionalEncoding,
        n_layer: int,
        name: str = "path",
        w_rank: int | None = 32,
        conv_size: int = 3,
        bias_scale: float | None = None,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(inner, name, n_layer)
        if inner.offers("qk_scores"):
            raise ValueError(f"PaTH replaces q·k, which encoding.inner '{inner.name}' replaces too — wrap an encoding "
                             f"without its own scores (e.g. encoding@encoding.inner=nope)")
        if w_rank is not None and w_rank <= 0:
            raise ValueError(f"encoding.w_rank must be positive (null: a full-rank projection), got {w_rank}")
        if conv_size < 0:
            raise ValueError(f"encoding.conv_size must be >= 0 (0: no short convolution), got {conv_size}")
        self.w_rank, self.conv_size = w_rank, conv_size
        # H_{j+1} is the oldest transform between key j and a query; its convolution reads x_{j+3-c}
        self.reach = max(self.reach, conv_size - 2)
        self.bias_scale = self.parameter_scale("bias_scale", bias_scale)
        width, d_model = self.n_head * self.head_dim, self.d_model
        if w_rank is None:  # (layer, H·d, d_model): one projection per layer
            self.w_up = nn.Parameter(torch.randn(n_layer, width, d_model) * init_std)
            self.w_down = None
        else:  # fla's low-rank w_proj: (H·d, rank)(rank, d_model)
            self.w_down = nn.Parameter(torch.randn(n_layer, w_rank, d_model) * init_std)
            self.w_up = nn.Parameter(torch.randn(n_layer, width, w_rank) * init_std)
        bound = 1.0 / math.sqrt(max(conv_size, 1))  # nn.Conv1d's default for a depthwise kernel
        self.conv = nn.Parameter(torch.empty(n_layer, width, conv_size).uniform_(-bound, bound)) if conv_size else None
        self.beta_weight = nn.Parameter(torch.randn(n_layer, self.n_head, d_model) * init_std)
        self.beta_bias = nn.Parameter(torch.zeros(n_layer, self.n_head))

    def projections(self, x: Tensor, layer: int) -> Tensor:
        """W_w x_t, the short convolution's input: x (B, T, d_model) -> (B, T, H·d), in at least float32."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        x = x.to(dtype)
        u = x if self.w_down is None else x @ self.w_down[layer].to(dtype).T  # (B, T, rank)
        return u @ self.w_up[layer].to(dtype).T  # (B, T, H·d)

    def householder_vectors(self, x: Tensor, doc: Tensor | None, layer: int,
                            past: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """w_t (B, H, T, d), unit length per head, and β_t (B, H, T) in (0, 2) from the block's
        input x (B, T, d_model), in at least float32. past: (B, P, H·d) the projections of the tokens
        just before x (decoding: what the short convolution reaches back to), or None (zeros)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        B, T, _ = x.shape
        x = x.to(dtype)
        u = self.projections(x, layer)  # (B, T, H·d)
        if self.conv is not None:
            if past is not None:  # one sequence: the convolution over the past and these, these rows kept
                u = short_convolution(torch.cat((past, u), dim=1), self.conv[layer].to(dtype), None)[:, past.shape[1]:]
            else:
                u = short_convolution(u, self.conv[layer].to(dtype), doc)
        w = F.normalize(u.view(B, T, self.n_head, self.head_dim), dim=-1).transpose(1, 2)  # (B, H, T, d)
        logits = x @ self.beta_weight[layer].to(dtype).T + self.bias_scale * self.beta_bias[layer].to(dtype)
        return w, 2.0 * torch.sigmoid(logits).transpose(1, 2)  # (B, T, H) -> (B, H, T)

    def qk_scores(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> ScoreRows:
        """s_ij = q_iᵀ H_i ··· H_{j+1} k_j as row blocks, in at least float32."""
        if ctx.x is None:
            raise ValueError("PaTH's transforms are computed from the block's input: call qk_scores inside a block "
                             "(Context.with_input)")
        with torch.autocast(ctx.device.type, enabled=False):  # a product of up to T transforms: no bf16
            w, beta = self.householder_vectors(ctx.x, ctx.doc, layer)
            dtype = w.dtype
            return PathScores(q.to(dtype), k.to(dtype), w, beta).rows

    def fused_attention(self, ctx: Context, layer: int = 0, log_gates: bool = False) -> FusedAttention | None:
        """Where fla's kernels run, flash-linear-attention's PaTH attention (given a wrapping FoX's gates:
        PaTH-FoX) around an encoding that acts on q and k alone."""
        def transforms(ctx: Context, layer: int) -> tuple[Tensor, Tensor]:  # w, β in float32, as fla takes them
            with torch.autocast(ctx.x.device.type, enabled=False):
                return self.householder_vectors(ctx.x, ctx.doc, layer)

        if not self.inner_acts_on_qk():
            return None
        return fla_kernels.path_kernel(ctx, layer, self.head_dim, self.name, transforms)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The keys carried through every later token's transform (``Carried``), where the inner encoding's
        cache is keys at their positions and nothing more (NoPE, RoPE, a bias); else None (recomputed)."""
        inner = super().kv_cache(layer, window)
        return Carried(self, layer, window, self) if type(inner) is KeysAtPositions else None

    def options(self) -> dict[str, object]:
        return {**super().options(), "w_rank": self.w_rank, "conv_size": self.conv_size,
                "bias_scale": self.bias_scale}


class Carried(KeysAtPositions):
    """PaTH's keys, each carried through the transforms of the tokens after it up to the latest:
    k̃_j = H_n ··· H_{j+1} k_j (k_j after the inner encoding's transform_qk). A new token i first carries
    every kept key one step further, k̃_j <- H_i k̃_j = k̃_j - β_i (w_iᵀ k̃_j) w_i (O(S·d)), then joins
    as k_i itself, and its scores are q_i·k̃_j = q_iᵀ H_i ··· H_{j+1} k_j (fla's decoding of PaTH). Kept
    besides: the projections of the last conv_size - 1 tokens, which the short convolution reads."""

    keeps = "keys carried through each later token's Householder transform, values, the convolution's last inputs"

    def __init__(self, encoding: PositionalEncoding, layer: int, window: Window, path: PaTH) -> None:
        super().__init__(encoding, layer, window)
        self.path = path
        self.past: Tensor | None = None  # (B, conv_size - 1, H·d)

    def remember(self, x: Tensor) -> None:
        """Keep the projections of the last conv_size - 1 tokens of x (B, t, d_model) and before."""
        reach = self.path.conv_size - 1
        if self.path.conv is None or reach < 1:
            return
        u = self.path.projections(x, self.layer)
        past = self.past if self.past is not None else u.new_zeros(u.shape[0], reach, u.shape[-1])
        self.past = torch.cat((past, u), dim=1)[:, -reach:]

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> None:
        _, k = self.transform(q, k, ctx)
        with torch.autocast(k.device.type, enabled=False):  # a product of up to T transforms: no bf16
            w, beta = self.path.householder_vectors(ctx.x, None, self.layer)
            self.keys = carried_to_end(k.to(w.dtype), w, beta)
        self.values, self.length = v, ctx.T
        self.remember(ctx.x)
        self.trim()

    def extend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> Rows:
        n0, t = self.length, q.shape[-2]
        q, k = self.transform(q, k, ctx)
        with torch.autocast(k.device.type, enabled=False):
            w, beta = self.path.householder_vectors(ctx.x, None, self.layer, self.past)  # (B, H, t, d), (B, H, t)
        self.remember(ctx.x)
        self.values, self.length = cat(self.values, v), n0 + t

        def carried_scores(q: Tensor) -> Tensor:  # q scaled: (B, H, t, d) -> (B, H, t, S)
            rows = []
            for s in range(t):  # each new token's transform, then its own key, then its row
                wt, bt = w[..., s, :], beta[..., s, None, None]  # (B, H, d), (B, H, 1, 1)
                keys = self.keys
                if keys is not None:
                    keys = keys - bt * (keys @ wt[..., :, None]) * wt[..., None, :]  # H_i k̃_j
                self.keys = cat(keys, k[..., s:s + 1, :].to(w.dtype))
                rows.append(q[..., s:s + 1, :].to(w.dtype) @ self.keys.transpose(-1, -2))  # (B, H, 1, S_s)
            width = self.keys.shape[-2]  # later new keys are hidden from earlier queries: zero there
            return torch.cat([F.pad(r, (0, width - r.shape[-1])) for r in rows], dim=-2)

        rows = self.rows(q, n0, ctx, carried_scores)
        self.trim()
        return rows

    def tensors(self) -> list[Tensor]:
        return [*super().tensors(), *([self.past] if self.past is not None else [])]
