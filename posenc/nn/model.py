"""A decoder-only, pre-LayerNorm GPT whose only positional machinery is its encoding.

nanoGPT's shape: CausalSelfAttention, MLP, Block, GPT; tied embeddings and GPT-2's init.
The model owns one encoding, computes positions once per forward, asks for the bias once
(shared by all layers, as T5 does) and hands the encoding to every block's attention,
which calls ``rotate`` on q and k. Nothing here knows an encoding's name.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.attention import PositionBias, causal_attention, position_bias
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.linear_attention import causal_linear_attention


ATTENTIONS = ("softmax", "linear")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float, attention: str = "softmax") -> None:
        super().__init__()
        self.n_head = n_head
        self.attention = attention
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, bias: PositionBias,
                layer: int) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, H, T, hd)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.attention == "linear":  # RoFormer eq. (19): rotate the features φ(q), φ(k)
            y = causal_linear_attention(q, k, v, lambda fq, fk: encoding.rotate(fq, fk, ctx, layer))
        else:
            q, k = encoding.rotate(q, k, ctx, layer)
            content = encoding.content_bias(q, k, ctx, layer) if encoding.has_content_bias else None
            y = causal_attention(q, k, v, bias, self.dropout if self.training else 0.0, content, ctx.pos)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, H, T, hd) -> (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float, attention: str = "softmax") -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout, attention)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: Context, bias: PositionBias,
                layer: int) -> Tensor:
        x = x + self.attn(self.ln_1(x), encoding, ctx, bias, layer)  # pre-LN residual
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        encoding: PositionalEncoding,
        n_layer: int = 4,
        n_head: int = 4,
        d_model: int = 256,
        dropout: float = 0.0,
        attention: str = "softmax",
    ) -> None:
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"model.attention must be one of {', '.join(ATTENTIONS)}, got '{attention}'")
        for key, value in (("vocab_size", vocab_size), ("n_layer", n_layer), ("n_head", n_head), ("d_model", d_model)):
            if value <= 0:
                raise ValueError(f"model.{key} must be positive, got {value}")
        if d_model % n_head != 0:
            raise ValueError(f"model.d_model={d_model} is not divisible by model.n_head={n_head}")
        if attention == "linear" and (encoding.has_bias or encoding.has_content_bias):
            raise ValueError(
                f"model.attention=linear has no score matrix to add the bias of encoding '{encoding.name}' to "
                f"— use a rotary, additive or no encoding (e.g. encoding=rope) or model.attention=softmax"
            )
        self.vocab_size = vocab_size
        self.n_layer = n_layer
        self.d_model = d_model
        self.encoding = encoding
        self.wte = nn.Embedding(vocab_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout, attention) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf, 2017)

        # GPT-2 init; the encoding initialises its own parameters
        for module in (self.wte, self.blocks, self.ln_f):
            module.apply(self._init_weights)
        for name, p in self.blocks.named_parameters():
            if name.endswith("c_proj.weight"):  # scaled init of residual projections (GPT-2)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6N + 12·L·d·T (PaLM, appendix B; nanoGPT's estimate_mfu).

        N counts every parameter that takes part in a matmul: the tied embedding does (as the
        output head), a learned position table does not (it is a lookup).
        """
        n = sum(p.numel() for name, p in self.named_parameters() if not name.startswith("encoding."))
        return 6 * n + 12 * self.n_layer * self.d_model * seq_len

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, pos: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """idx: (B, T) token ids; targets: (B, T) or None; pos: (T,) positions, default 0..T-1.

        Returns logits (B, T, vocab) and the mean cross-entropy (nats/token) if targets.
        """
        dtype = torch.get_autocast_dtype(idx.device.type) if torch.is_autocast_enabled(idx.device.type) \
            else self.wte.weight.dtype
        # the per-forward context every hook sees; explicit positions cost one sync, by request
        ctx = Context.arange(idx.shape[1], idx.device, dtype) if pos is None else Context.at(pos, dtype)
        self.encoding.prepare(ctx.length)
        x = self.encoding.embed(self.wte(idx), ctx)  # (B, T, C)
        x = self.drop(x)
        # a position bias is computed once per forward and shared by every layer (as T5 does)
        bias = position_bias(self.encoding, ctx, self.drop.p if self.training else 0.0)
        for layer, block in enumerate(self.blocks):
            x = block(x, self.encoding, ctx, bias, layer)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
