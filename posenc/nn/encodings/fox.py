"""FoX, the Forgetting Transformer (Lin, Nikishin, He & Courville, ICLR 2025, "Forgetting
Transformer: Softmax Attention with a Forget Gate").

Each head of each layer computes a scalar forget gate from every token's input to the layer and
down-weights the logits of older keys by the product of the gates in between:

    f_t = σ(w_h·x_t + b_h)                                 (B, H, T), in (0, 1)
    D_ij = Σ_{t=j+1..i} log f_t = c_i - c_j,  c_i = Σ_{t<=i} log f_t
    o_i = Σ_j softmax_j(q_i·k_j/√d + D_ij) v_j

a data-dependent ALiBi (x-transformers' ``DataDependentAlibi``): D_ij <= 0 and non-increasing as
j moves back. With every gate 1, D = 0 and FoX is the attention it wraps. The paper's FoX has
no RoPE (``encoding@encoding.inner=nope``, the default); it also reports FoX with RoPE
(``encoding@encoding.inner=rope``). Only the forget gate is built here, not the "Pro" block's
output gate, QK-norm or key/value shift, which change the block rather than the position
mechanism.

The decays are the contract's ``decay`` hook: c (B, H, T), so attention never holds more than
O(T) for them: rows c_i - c_j of the explicit mask on CPU (chunked for long sequences), a
score_mod over the captured c on CUDA (posenc/nn/flex.py). Under document masking a pair across
documents is masked, so the cumulative sum over the whole window needs no restart.

**Parameters and their scale.** Per layer a gate projection w (H x d_model) and bias b (H),
as the paper's ``fgate_proj`` (bias zero: every gate starts near σ(0) = 1/2, the paper's
initialisation of its data-dependent gate). The bias enters as ``bias_scale · b``: one Adam step
moves b by about lr, so the logit of the gate moves by bias_scale·lr (√head_dim by default, as
T5's table here): 400 steps at lr 2e-3 can take every gate from 1/2 to σ(4.5) ≈ 0.99, where
unscaled they could reach only σ(0.8) ≈ 0.69 — the slow decay the paper's trained gates reach.
w·x needs no scale: its step is already lr·Σ_d |x_d|.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.cumsum import cumsum
from posenc.nn import fla_kernels
from posenc.nn.encodings.base import Context, FusedAttention, PositionalEncoding
from posenc.nn.encodings.cache import LayerCache, Rows, cat, plus
from posenc.nn.encodings.mechanism import Mechanism
from posenc.nn.mask import Window


def cumulative_log_gates(log_f: Tensor) -> Tensor:
    """c_i = Σ_{t<=i} log f_t along the last dim: (..., T) -> (..., T), so that
    c_i - c_j = Σ_{t=j+1..i} log f_t."""
    return cumsum(log_f, -1)


class FoX(Mechanism):
    """A per-head forget gate from each token, its log cumulative sums as logit decays."""

    def __init__(
        self,
        inner: PositionalEncoding,
        n_layer: int,
        name: str = "fox",
        bias_scale: float | None = None,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(inner, name, n_layer)
        self.bias_scale = self.parameter_scale("bias_scale", bias_scale)
        # (layer, head, d_model) and (layer, head): the paper's fgate_proj, one per layer
        self.gate_weight = nn.Parameter(torch.randn(n_layer, self.n_head, self.d_model) * init_std)
        self.gate_bias = nn.Parameter(torch.zeros(n_layer, self.n_head))

    def log_forget_gates(self, x: Tensor, layer: int) -> Tensor:
        """log f_t = log σ(w_h·x_t + bias_scale·b_h): x (B, T, d_model) -> (B, H, T) in at least
        float32 (the cumulative sum runs over up to T of them)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        logits = x.to(dtype) @ self.gate_weight[layer].to(dtype).T + self.bias_scale * self.gate_bias[layer].to(dtype)
        return F.logsigmoid(logits.to(dtype)).transpose(1, 2)  # (B, T, H) -> (B, H, T)

    def decay(self, ctx: Context, layer: int = 0) -> Tensor:
        """c: (B, H, T), plus the inner encoding's decays if it has any."""
        if ctx.x is None:
            raise ValueError("FoX's forget gates are computed from the block's input: call decay inside a block "
                             "(Context.with_input)")
        c = cumulative_log_gates(self.log_forget_gates(ctx.x, layer))
        inner = self.inner_decay(ctx, layer)
        return c if inner is None else c + inner

    def fused_attention(self, ctx: Context, layer: int = 0, log_gates: bool = False) -> FusedAttention | None:
        """Where fla's kernels run, flash-linear-attention's forgetting attention around an encoding that
        acts on q and k alone (FoX, FoX-RoPE), or the inner encoding's own kernel given the gates (PaTH-FoX)."""
        def gates(ctx: Context, layer: int) -> Tensor:  # log f_t (B, H, T): fla sums them itself
            return self.log_forget_gates(ctx.x, layer)

        if self.inner.offers("fused_attention"):
            return fla_kernels.with_gates(self.inner.fused_attention(ctx, layer, log_gates=True), gates)
        if not self.inner_acts_on_qk():
            return None
        return fla_kernels.forgetting_kernel(ctx, layer, self.head_dim, self.name, gates)

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The inner encoding's cache, and the cumulative log gates c_j of the kept tokens (``Decayed``)."""
        inner = super().kv_cache(layer, window)
        return None if inner is None else Decayed(inner, self)

    def options(self) -> dict[str, object]:
        return {**super().options(), "bias_scale": self.bias_scale}


class Decayed(LayerCache):
    """A FoX layer's cache: its inner encoding's, and c_j = Σ_{t<=j} log f_t of every kept token (B, H, S)
    with the latest c. A new token's c is the latest plus its own log gate, and its row gains c_i - c_j,
    the full forward's decays: O(1) a token beside the inner cache's work."""

    def __init__(self, inner: LayerCache, fox: FoX) -> None:
        super().__init__(inner.encoding, inner.layer, inner.window)
        self.inner, self.fox = inner, fox
        self.c: Tensor | None = None  # (B, H, S): c of the kept tokens
        self.last: Tensor | None = None  # (B, H, 1): c of the latest token

    def describe(self) -> str:
        return f"{self.inner.describe()}, cumulative log forget gates"

    def gates(self, ctx: Context) -> Tensor:
        """c of the tokens ctx holds (the block's input), from the latest kept c: (B, H, t)."""
        c = cumulative_log_gates(self.fox.log_forget_gates(ctx.x, self.layer))
        return c if self.last is None else self.last + c

    def keep(self, c: Tensor) -> Tensor:
        """The kept c with the new tokens' c appended (B, H, start..n), then trimmed as the inner cache."""
        self.c, self.last = cat(self.c, c, dim=-1), c[..., -1:]
        kept = self.c
        self.length, drop = self.inner.length, self.kept(self.inner.start)
        self.c = self.c[..., drop:]
        return kept

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> None:
        self.inner.prefill(q, k, v, ctx)
        self.keep(self.gates(ctx))

    def extend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> Rows:
        rows = self.inner.extend(q, k, v, ctx)
        start = self.start
        c_new = self.gates(ctx)
        c_keys = self.keep(c_new)[..., rows.k_start - start:]  # (B, H, S): c_j of the keys the rows see
        rows.terms = plus(rows.terms, c_new[..., :, None] - c_keys[..., None, :])  # c_i - c_j: (B, H, t, S)
        return rows

    def retarget(self, encoding: PositionalEncoding) -> LayerCache:
        self.inner.retarget(encoding)
        return super().retarget(encoding)

    def tensors(self) -> list[Tensor]:
        return [*self.inner.tensors(), *(t for t in (self.c, self.last) if t is not None)]
