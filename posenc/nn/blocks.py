"""A transformer block's parts, built as a flavour says: norm, attention, MLP.

``CausalSelfAttention`` is the only place attention is called; a layer kind with a recurrent mixer
(posenc/nn/layout.py) has a ``RecurrentMixer`` in its place (posenc/nn/recurrent.py). The norm and
MLP follow the flavour (posenc/nn/flavors.py). Every linear's bias follows ``flavor.bias``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn import fused
from posenc.nn.attention import (
    LayerTerms,
    Plan,
    attend_layer,
    dense_plan,
    encode,
    explicit_weights,
    with_terms,
)
from posenc.nn.decoding import InputRecompute, LayerState, attend_cached, layer_cache
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.flavors import Flavor, swiglu_hidden
from posenc.nn.linear_attention import causal_linear_attention
from posenc.nn.mask import Window
from posenc.nn.recurrent import RecurrentMixer


class RMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm (Zhang & Sennrich, 2019: LayerNorm without centring or bias), normalised in
    fp32 whatever the input's dtype (bf16's mean of squares loses digits), then back to it."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__(d_model, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return fused.rms_norm(x, self.weight, self.eps)


def make_norm(d_model: int, flavor: Flavor) -> nn.Module:
    match flavor.norm:
        case "layernorm":
            return nn.LayerNorm(d_model, bias=flavor.bias)
        case "rmsnorm":
            return RMSNorm(d_model)
    raise ValueError(f"unknown norm '{flavor.norm}'")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float, attention: str = "softmax",
                 bias: bool = True) -> None:
        super().__init__()
        self.n_head = n_head
        self.attention = attention
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, plan: Plan, layer: int,
                cache: LayerState | None = None) -> Tensor:
        """encoding: this layer's encoding; plan: how this layer attends in this forward; cache: what the layer
        keeps while decoding (``new_cache``): empty, x is the prompt's and is kept; else x is the next tokens'."""
        B, T, C = x.shape
        if self.attention == "linear":  # RoFormer eq. (19): rotate the features φ(q), φ(k)
            if cache is not None and cache.length:
                return cache.extend(x, ctx.dtype, lambda xs, c: self(xs, encoding, c, None, layer))
            q, k, v = self.heads(x)
            y = causal_linear_attention(q, k, v, lambda fq, fk: encoding.transform_qk(fq, fk, ctx, layer))
            if cache is not None:
                cache.prefill(x)
        else:  # the encoding's hooks see this block's input x (FoX's forget gates are computed from it)
            q, k, v = self.heads(x)
            if cache is not None and cache.length:  # decoding: the new tokens against what the cache keeps
                y = attend_cached(cache.extend(q, k, v, ctx.with_input(x)), cache.window)
            else:
                y = attend_layer(q, k, v, encoding, ctx.with_input(x), layer, plan,
                                 self.dropout if self.training else 0.0)
                if cache is not None:
                    cache.prefill(q, k, v, ctx.with_input(x))
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, H, T, hd) -> (B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def new_cache(self, encoding: PositionalEncoding, layer: int, window: Window) -> LayerState:
        """What this layer keeps while decoding: its encoding's cache (posenc/nn/decoding.py); linear
        attention keeps its block input and runs over the prefix."""
        return InputRecompute() if self.attention == "linear" else layer_cache(encoding, layer, window)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, C) -> q, k, v each (B, H, T, hd)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        return tuple(t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))

    def encoded(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, layer: int
                ) -> tuple[Tensor, Tensor, Tensor, LayerTerms]:
        """q, k (rotated and scaled by the encoding), v, and what the encoding adds in this layer;
        its hooks see this block's input x (FoX's forget gates are computed from it)."""
        q, k, v = self.heads(x)
        q, k, terms = encode(encoding, q, k, ctx.with_input(x), layer)
        return q, k, v, terms

    @torch.no_grad()
    def weights(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, layer: int) -> Tensor:
        """The attention weights this layer uses on its input x (B, T, C), written out: (B, H, T, T)
        float32 (probes; softmax attention only)."""
        q, k, _, terms = self.encoded(x, encoding, ctx, layer)
        rows = with_terms(dense_plan(encoding, ctx, layer).rows(0, x.shape[1], 0), terms, 0, 0)
        return explicit_weights(q, k, rows, terms).float()


class MLP(nn.Module):
    """GPT-2's MLP: W2·GELU(W1·x), hidden 4d."""

    def __init__(self, d_model: int, dropout: float, bias: bool = True) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.c_proj = nn.Linear(4 * d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class SwiGLU(nn.Module):
    """Shazeer (2020): W2·(SiLU(W1·x) ⊙ W3·x), hidden 8d/3 so it holds GELU-MLP's parameters."""

    def __init__(self, d_model: int, dropout: float, bias: bool = False) -> None:
        super().__init__()
        hidden = swiglu_hidden(d_model)
        self.c_fc = nn.Linear(d_model, 2 * hidden, bias=bias)  # W1 and W3 in one matmul
        self.c_proj = nn.Linear(hidden, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)  # (B, T, 2h): the gate's and the up projection's halves
        if not torch.compiler.is_compiling():
            return self.dropout(self.c_proj(fused.swiglu(h)))  # no cat in the backward, SiLU's output not kept
        gate, up = h.chunk(2, dim=-1)  # 2 × (B, T, h)
        return self.dropout(self.c_proj(F.silu(gate) * up))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float, attention: str, flavor: Flavor,
                 mixer: str = "softmax") -> None:
        super().__init__()
        self.ln_1 = make_norm(d_model, flavor)
        # the token mixer: attention (softmax, or model.attention=linear) or the layer kind's recurrence
        self.attn = CausalSelfAttention(d_model, n_head, dropout, attention, bias=flavor.bias) if mixer == "softmax" \
            else RecurrentMixer(d_model, n_head, mixer, bias=flavor.bias)
        self.ln_2 = make_norm(d_model, flavor)
        mlp = SwiGLU if flavor.mlp == "swiglu" else MLP
        self.mlp = mlp(d_model, dropout, bias=flavor.bias)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, plan: Plan, layer: int,
                cache: LayerState | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), encoding, ctx, plan, layer, cache)  # pre-norm residual
        return x + self.mlp(self.ln_2(x))
