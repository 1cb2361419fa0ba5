"""A layer kind whose token mixer is a gated linear recurrence instead of softmax attention.

``mixer: gated_delta`` (Gated DeltaNet, Yang et al., ICLR 2025: the recurrence of Qwen3-Next),
``mixer: kda`` (Kimi Delta Attention, Kimi Linear: the gated delta rule with one decay per key
channel, posenc/nn/kda.py) or ``mixer: gla`` (scalar-decay gated linear attention: Mamba-2's SSD,
fla's simple_gla) in a layout (posenc/nn/layout.py). The layer follows fla's ``GatedDeltaNet``
layer (fla/layers/gated_deltanet.py), and for ``kda`` fla's ``KimiDeltaAttention``
(fla/layers/kda.py), per head of size d_h = d_model / H:

    q, k, v = SiLU(causal_conv4(W_q x)), SiLU(causal_conv4(W_k x)), SiLU(causal_conv4(W_v x))
    q, k    = L2-normalised (the delta rules: they need ‖k‖ = 1), then the layer kind's
              encoding's ``transform_qk`` (NoPE by default; RoPE inside: RoFormer §3.3)
    g_t     = -exp(A_log) · softplus(W_a x_t + dt_bias)    the log decay, α_t = exp(g_t) (Mamba-2's),
              one per head; for kda one per key channel, W_a = W_f↑ W_f↓ of rank d_h and
              dt_bias per channel (fla's f_proj)
    β_t     = σ(W_b x_t)                                   (the delta rules)
    o       = the recurrence (posenc/nn/recurrence.py, kda.py) of q / √d_h, k, v
    y       = W_o (RMSNorm(o) ⊙ SiLU(W_g x))                output gate and per-head norm; for kda
              σ(W_g↑ W_g↓ x + b_g), rank d_h with a bias (fla's g_proj and sigmoid-gated norm)

Kept from fla: the short convolution (kernel 4, SiLU) on q, k, v, the L2-normalised q, k and
sigmoid β of the delta rules, Mamba-2's decay parametrisation and initialisation (gated_delta
and gla: A ~ U(0, 16); kda: A ~ U(1, 16); dt in [1e-3, 0.1]), the gated RMSNorm on the output;
for kda its low-rank gate projections and sigmoid output gate. Left out: fla's value expansion
(GatedDeltaNet's expand_v = 2; KDA's is 1, as here) and head sizes (value width = d_model here,
so a gated_delta layer has the softmax layer's q, k, v, o projections plus the output gate: 5 d²
against 4 d²), grouped value heads, negative eigenvalues (allow_neg_eigval), KDA's bounded gate
(safe_gate, lower_bound) and the inference-time recurrent mode and caches.

The convolution and the recurrence both restart at every document under documents packing, as
fla's ``cu_seqlens`` does. On CUDA with flash-linear-attention installed (``pip install
posenc[fla]``) the recurrence runs in fla's chunked Triton kernels; otherwise (on a CPU, where Triton's
interpreter cannot run them either, and wherever fla refuses: posenc/nn/fla_kernels.py) in the
chunked PyTorch form.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn import fla_kernels, fused
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.decoding import InputRecompute
from posenc.nn.kda import chunked_kda, kda_step
from posenc.nn.kernels import KernelPolicy
from posenc.nn.recurrence import chunked_gated_delta_rule, chunked_gla, gated_delta_step, gla_step

#: each recurrent mixer a layer kind may name (``softmax`` is attention, posenc/nn/blocks.py) and
#: its chunked PyTorch form, called as f(q, k, v, g, beta, seg)
CHUNKED = {
    "gated_delta": chunked_gated_delta_rule,
    "gla": lambda q, k, v, g, beta, seg, **final: chunked_gla(q, k, v, g, seg, **final),
    "kda": chunked_kda,
}
#: one token of each: step(S, q_t, k_t, v_t, g_t, β_t) -> (o_t, S_t), S (B, H, dv, dk)
STEPS = {
    "gated_delta": gated_delta_step,
    "gla": lambda S, q, k, v, g, beta: gla_step(S, q, k, v, g),
    "kda": kda_step,
}
RULES = tuple(CHUNKED)
#: the short convolution's kernel (fla's conv_size)
CONV_SIZE = 4


def wide(x: Tensor) -> Tensor:
    """x in at least float32 (bf16 gates and norms lose digits; float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RecurrentMixer(nn.Module):
    """The token mixer of a recurrent layer kind; same call as ``CausalSelfAttention``. ``kernels``:
    the run's policy (posenc/nn/kernels.py: whether fla's kernel may run; the path taken, recorded
    for layer kind ``kind``): its own until the model that holds it gives it the model's."""

    kind: str | None = None

    def __init__(self, d_model: int, n_head: int, rule: str, bias: bool = False) -> None:
        super().__init__()
        self.kernels = KernelPolicy()
        if rule not in RULES:
            raise ValueError(f"a recurrent layer's mixer must be one of {', '.join(RULES)}, got '{rule}'")
        self.attention = rule  # what probes and checks read: not softmax attention
        self.n_head = n_head
        self.head_dim = d_model // n_head
        # W_q, W_k, W_v, the output gate W_g (kda: its down half), the decay's W_a (kda: its down
        # half) and β's W_b: one matmul, split after
        gates = self.head_dim if rule == "kda" else d_model
        self.widths = [3 * d_model, gates, gates if rule == "kda" else n_head] + ([n_head] if rule != "gla" else [])
        self.c_in = nn.Linear(d_model, sum(self.widths), bias=bias)
        self.conv_weight = nn.Parameter(torch.empty(3 * d_model, CONV_SIZE))
        self.o_norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.c_proj = nn.Linear(d_model, d_model, bias=bias)
        # Mamba-2's decay parametrisation and initialisation, as fla's GatedDeltaNet and KimiDeltaAttention
        A = torch.empty(n_head).uniform_(1, 16) if rule == "kda" else torch.empty(n_head).uniform_(0, 16).clamp_min(1e-4)
        self.A_log = nn.Parameter(A.log())
        decays = d_model if rule == "kda" else n_head  # one per key channel (H·d_h) or one per head
        dt = torch.exp(torch.rand(decays) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        nn.init.uniform_(self.conv_weight, -1 / math.sqrt(CONV_SIZE), 1 / math.sqrt(CONV_SIZE))  # Conv1d's init
        if rule == "kda":  # the up halves of KDA's low-rank gate projections (fla's f_proj[1], g_proj[1])
            self.f_up = nn.Linear(self.head_dim, d_model, bias=False)
            self.g_up = nn.Linear(self.head_dim, d_model, bias=True)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, plan: object = None,
                layer: int = 0, cache: RecurrentState | InputRecompute | None = None) -> Tensor:
        """x: (B, T, C) -> (B, T, C). ``plan`` (attention's) is unused: no mask, no scores. cache: what the
        layer keeps while decoding (``new_cache``): empty, x is the prompt's; else the next tokens'."""
        if isinstance(cache, InputRecompute):  # an encoding whose cache does not hold: the layer over the prefix
            if cache.length:
                return cache.extend(x, ctx.dtype, lambda xs, c: self(xs, encoding, c, None, layer))
            cache.prefill(x)
            cache = None
        B, T, C = x.shape
        seg = ctx.doc
        qkv, gate, a, *b = self.c_in(x).split(self.widths, dim=-1)  # (B, T, 3C), gate and decay inputs [, (B, T, H)]
        qkv = wide(qkv)  # float32 under autocast too
        if cache is None:
            qkv = fused.causal_conv_silu(qkv, self.conv_weight, seg)
        else:  # the convolution reads the last CONV_SIZE - 1 inputs before these (zero before the prompt)
            qkv = cache.convolve(qkv, lambda u: fused.causal_conv_silu(u, self.conv_weight, None))
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in qkv.split(C, dim=2))
        if b:  # the delta rule writes k with strength β: unit keys keep I - β k kᵀ a contraction
            q, k = fused.l2_normalize(wide(q)).type_as(q), fused.l2_normalize(wide(k)).type_as(k)
        q, k = encoding.transform_qk(q, k, ctx.with_input(x), layer)  # (B, H, T, hd)
        q = q / math.sqrt(self.head_dim)
        beta = torch.sigmoid(wide(b[0])).transpose(1, 2) if b else None  # (B, H, T)
        if cache is None:
            o = self.mix(q, k, v, self.log_decay(a), beta, seg)  # (B, H, T, hd)
        else:
            o = cache.mix(self.attention, q, k, v, self.log_decay(a), beta)
        o = fused.rms_norm(wide(o), self.o_norm.weight, self.o_norm.eps).type_as(x).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(o * (torch.sigmoid(self.g_up(gate)) if self.attention == "kda" else F.silu(gate)))

    def new_cache(self, encoding: PositionalEncoding, layer: int, window: object = None) -> RecurrentState | InputRecompute:
        """What this layer keeps while decoding: its state and its convolution's last inputs, where its encoding's
        transform_qk is known to be position-wise (``cache_holds``); else its block input, run over the prefix."""
        return RecurrentState() if encoding.cache_holds() else InputRecompute()

    def log_decay(self, a: Tensor) -> Tensor:
        """g = log α = -exp(A_log) · softplus(W_a x + dt_bias), in float32: a (B, T, H) -> (B, H, T),
        or for kda a (B, T, d_h), the decay's low-rank input -> (B, H, T, d_h), one per key channel."""
        if self.attention != "kda":
            return (-wide(self.A_log).exp() * F.softplus(wide(a) + self.dt_bias)).transpose(1, 2)
        f = wide(self.f_up(a)).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)  # (B, H, T, d_h)
        # computed in (B, H, T, d_h) order, the order its gradient comes back in: softplus's backward then
        # sees one layout, where a transposed gradient made AOTAutograd's compiled backward view it wrongly
        bias = self.dt_bias.view(self.n_head, 1, self.head_dim)
        return -wide(self.A_log).exp()[:, None, None] * F.softplus(f.contiguous() + bias)

    def mix(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, seg: Tensor | None) -> Tensor:
        """The recurrence: fla's kernels where they run and are usable, the chunked PyTorch form otherwise."""
        policy = self.kernels
        kernel = fla_kernels.usable(self.attention, q, v, policy)
        if not torch.compiler.is_compiling():  # in a compiled model: GPT.planned records it
            policy.ran.saw(self.kind or self.attention, fla_kernels.path(self.attention, q.device.type, policy))
        if kernel is not None:
            return fla_kernels.mix(kernel, self.attention, q, k, v, g, beta, seg)
        return CHUNKED[self.attention](q, k, v, g, beta, seg)


class RecurrentState:
    """What a recurrent layer keeps while decoding: its state S (B, H, dv, dk) after the last token, and
    the short convolution's last CONV_SIZE - 1 inputs (B, CONV_SIZE - 1, 3C), in at least float32: O(1)
    in the sequence's length. The prompt's state comes from the chunked form (``final``), each next
    token's from one step of the recurrence."""

    keeps = "recurrent state (d_h × d_h per head), the short convolution's last inputs"

    def __init__(self) -> None:
        self.S: Tensor | None = None
        self.conv: Tensor | None = None
        self.length = 0

    def convolve(self, u: Tensor, conv: Callable[[Tensor], Tensor]) -> Tensor:
        """conv (the layer's causal convolution) of the inputs u (B, t, 3C) after the kept ones: (B, t, 3C)."""
        past = self.conv if self.conv is not None else u.new_zeros(u.shape[0], CONV_SIZE - 1, u.shape[-1])
        full = torch.cat((past, u), dim=1)
        self.conv = full[:, -(CONV_SIZE - 1):]
        return conv(full)[:, past.shape[1]:]

    def mix(self, rule: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None) -> Tensor:
        """The recurrence over the new tokens from the kept state (the prompt: the chunked form from zero):
        q, k (B, H, t, dk), v (B, H, t, dv), g (B, H, t[, dk]), beta (B, H, t) or None -> (B, H, t, dv)."""
        if self.S is None:
            o, self.S = CHUNKED[rule](q, k, v, g, beta, None, final=True)
        else:
            dtype = torch.promote_types(q.dtype, torch.float32)
            beta = beta if beta is not None else torch.zeros_like(g)
            out = []
            for t in range(q.shape[-2]):
                o_t, self.S = STEPS[rule](self.S, *(x[:, :, t].to(dtype) for x in (q, k, v, g, beta)))
                out.append(o_t)
            o = torch.stack(out, dim=-2).to(v.dtype)
        self.length += q.shape[-2]
        return o

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.S, self.conv) if t is not None)

    def describe(self) -> str:
        return self.keeps
