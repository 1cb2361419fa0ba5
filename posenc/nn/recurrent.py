"""A layer kind whose token mixer is a gated linear recurrence instead of softmax attention.

``mixer: gated_delta`` (Gated DeltaNet, Yang et al., ICLR 2025: the recurrence of Qwen3-Next and,
with per-channel gates, of Kimi Linear's KDA) or ``mixer: gla`` (scalar-decay gated linear
attention: Mamba-2's SSD, fla's simple_gla) in a layout (posenc/nn/layout.py). The layer follows
fla's ``GatedDeltaNet`` layer (fla/layers/gated_deltanet.py), per head of size d_h = d_model / H:

    q, k, v = SiLU(causal_conv4(W_q x)), SiLU(causal_conv4(W_k x)), SiLU(causal_conv4(W_v x))
    q, k    = L2-normalised (gated_delta only: the delta rule needs ‖k‖ = 1), then the layer
              kind's encoding's ``transform_qk`` (NoPE by default; RoPE inside: RoFormer §3.3)
    g_t     = -exp(A_log) · softplus(W_a x_t + dt_bias)    the log decay, α_t = exp(g_t) (Mamba-2's)
    β_t     = σ(W_b x_t)                                   (gated_delta only)
    o       = the recurrence (posenc/nn/recurrence.py) of q / √d_h, k, v
    y       = W_o (RMSNorm(o) ⊙ SiLU(W_g x))                output gate and per-head norm

Kept from fla: the short causal convolution (kernel 4, SiLU) on q, k, v, the L2-normalised q, k
and sigmoid β of the delta rule, Mamba-2's decay parametrisation and initialisation (A ~ U(0, 16),
dt in [1e-3, 0.1]) for both rules, the gated RMSNorm on the output. Left out: fla's value
expansion (expand_v = 2) and head sizes (value width = d_model here, so the layer has the softmax
layer's q, k, v, o projections plus the output gate: 5 d² against 4 d²), grouped value heads,
negative eigenvalues (allow_neg_eigval) and per-channel gates (KDA).

The convolution and the recurrence both restart at every document under documents packing, as
fla's ``cu_seqlens`` does. On CUDA with flash-linear-attention installed (``pip install
posenc[fla]``) the recurrence runs in fla's chunked Triton kernels; otherwise (and always on CPU)
in the chunked PyTorch form.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn import fla_kernels, fused
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.recurrence import chunked_gated_delta_rule, chunked_gla

#: the recurrent mixers a layer kind may name (``softmax`` is attention, posenc/nn/blocks.py)
RULES = ("gated_delta", "gla")
#: the short convolution's kernel (fla's conv_size)
CONV_SIZE = 4


def wide(x: Tensor) -> Tensor:
    """x in at least float32 (bf16 gates and norms lose digits; float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RecurrentMixer(nn.Module):
    """The token mixer of a recurrent layer kind; same call as ``CausalSelfAttention``."""

    def __init__(self, d_model: int, n_head: int, rule: str, bias: bool = False) -> None:
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"a recurrent layer's mixer must be one of {', '.join(RULES)}, got '{rule}'")
        self.attention = rule  # what probes and checks read: not softmax attention
        self.n_head = n_head
        self.head_dim = d_model // n_head
        # W_q, W_k, W_v, the output gate W_g, the decay's W_a and β's W_b: one matmul, split after
        self.widths = [3 * d_model, d_model, n_head] + ([n_head] if rule == "gated_delta" else [])
        self.c_in = nn.Linear(d_model, sum(self.widths), bias=bias)
        self.conv_weight = nn.Parameter(torch.empty(3 * d_model, CONV_SIZE))
        self.o_norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)
        # Mamba-2's decay parametrisation and initialisation, as fla's GatedDeltaNet
        self.A_log = nn.Parameter(torch.empty(n_head).uniform_(0, 16).clamp_min(1e-4).log())
        dt = torch.exp(torch.rand(n_head) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        nn.init.uniform_(self.conv_weight, -1 / math.sqrt(CONV_SIZE), 1 / math.sqrt(CONV_SIZE))  # Conv1d's init

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, plan: object = None,
                layer: int = 0) -> Tensor:
        """x: (B, T, C) -> (B, T, C). ``plan`` (attention's) is unused: no mask, no scores."""
        B, T, C = x.shape
        seg = ctx.doc
        qkv, gate, a, *b = self.c_in(x).split(self.widths, dim=-1)  # (B, T, 3C), (B, T, C), (B, T, H) [, (B, T, H)]
        qkv = fused.causal_conv_silu(wide(qkv), self.conv_weight, seg)  # float32 under autocast too
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in qkv.split(C, dim=2))
        if b:  # the delta rule writes k with strength β: unit keys keep I - β k kᵀ a contraction
            q, k = fused.l2_normalize(wide(q)).type_as(q), fused.l2_normalize(wide(k)).type_as(k)
        q, k = encoding.transform_qk(q, k, ctx.with_input(x), layer)  # (B, H, T, hd)
        q = q / math.sqrt(self.head_dim)
        g = (-wide(self.A_log).exp() * F.softplus(wide(a) + self.dt_bias)).transpose(1, 2)  # (B, H, T) log α
        beta = torch.sigmoid(wide(b[0])).transpose(1, 2) if b else None  # (B, H, T)
        o = self.mix(q, k, v, g, beta, seg)  # (B, H, T, hd)
        o = fused.rms_norm(wide(o), self.o_norm.weight, self.o_norm.eps).type_as(x).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(o * F.silu(gate))

    def mix(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, seg: Tensor | None) -> Tensor:
        """The recurrence: fla's kernels on CUDA when installed, the chunked PyTorch form otherwise."""
        if fla_kernels.usable(self.attention, q, v):
            return fla_kernels.mix(self.attention, q, k, v, g, beta, seg)
        if beta is not None:
            return chunked_gated_delta_rule(q, k, v, g, beta, seg)
        return chunked_gla(q, k, v, g, seg)
