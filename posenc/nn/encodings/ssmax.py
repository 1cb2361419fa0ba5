"""Scalable-Softmax, SSMax (Nakanishi, 2025, "Scalable-Softmax Is Superior for Attention").

Softmax over n keys flattens as n grows (its largest weight goes to 0 for bounded logits), so
attention fades on sequences longer than training. SSMax makes the base of the exponential the
number of keys:

    SSMax(z)_j = n^{s·z_j} / Σ_k n^{s·z_k} = softmax((s·log n) · z)_j

with a learned s per head (and layer), n the number of keys query i sees. The paper applies it
by multiplying the query by s·log n; so does posenc, through the contract's ``logit_scale``,
which keeps every attention kernel as it is. n is counted by the layer's mask
(``AttentionMask.visible_keys``): i + 1 under plain causal attention, the keys inside the
query's document and window otherwise. A wrapped encoding's bias is added unscaled (the paper's
models have RoPE and no bias; the scale multiplies q_i·k_j/√d).

``learned: false`` keeps s fixed at its initial value: a length-dependent temperature with no
parameters (Llama 4's τ(m) = 1 + β·ln(⌊m/L⌋ + 1) is the same hook, in ``rope_nope``).

**Parameters and their scale.** s (n_layer x H) starts at ``init_s``, by default 1/ln L with L
the training length, so that at n = L the scale is exactly 1 and the model starts as softmax
over a full window; shorter prefixes start flatter (scale ln n / ln L < 1). s needs no extra
scale: at L = 64 it starts at 0.24 and one Adam step moves it by about lr, 0.8 over 400 steps
at lr 2e-3, three times its starting value.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.encodings.cache import LayerCache
from posenc.nn.encodings.mechanism import Mechanism
from posenc.nn.mask import Window


def ssmax_scale(s: Tensor, n: Tensor) -> Tensor:
    """s·log n: s (H,) per head, n (B|1, T) visible keys per query -> (B|1, H, T, 1)."""
    return s[None, :, None, None] * torch.log(n.to(s.dtype))[:, None, :, None]


class SSMax(Mechanism):
    """Logits of query i scaled by s_h·log n_i, n_i the keys it sees."""

    def __init__(
        self,
        inner: PositionalEncoding,
        n_layer: int,
        name: str = "ssmax",
        train_len: int | None = None,
        init_s: float | None = None,
        learned: bool = True,
    ) -> None:
        super().__init__(inner, name, n_layer)
        if init_s is None:
            if not train_len or train_len < 2:
                raise ValueError("encoding.init_s=null starts s at 1/ln L, L the training length: train at "
                                 "trainer.seq_len >= 2 or set encoding.init_s")
            init_s = 1.0 / math.log(train_len)
        if not init_s > 0:
            raise ValueError(f"encoding.init_s must be > 0, got {init_s}")
        self.init_s = float(init_s)
        self.learned = bool(learned)
        s = torch.full((n_layer, self.n_head), self.init_s)
        if self.learned:
            self.s = nn.Parameter(s)
        else:
            self.register_buffer("s", s)

    def logit_scale(self, ctx: Context, layer: int = 0) -> Tensor:
        """(B|1, H, T, 1): s_h·log n_i for this layer's mask, times the inner encoding's scale."""
        n = ctx.mask(layer).visible_keys(ctx.device)  # (B|1, T)
        dtype = torch.promote_types(ctx.dtype, torch.float32)
        scale = ssmax_scale(self.s[layer].to(dtype), n)
        inner = self.inner_logit_scale(ctx, layer)
        return scale if inner is None else scale * inner

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """The inner encoding's cache: s·log n_i is read for the new query from its position and its layer's
        mask (the keys it sees), nothing kept."""
        return super().kv_cache(layer, window)

    def options(self) -> dict[str, object]:
        return {**super().options(), "init_s": self.init_s, "learned": self.learned}
