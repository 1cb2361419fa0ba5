"""The plain reference of `posenc bench`: nanoGPT's model, nothing else.

The smallest honest baseline: a block stack written here, with learned absolute positions
and SDPA's causal kernel, at the same shape and trained by the same train_step. posenc's
ratio to it is the price of the framework, separate from the price of the encoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

REFERENCE = "reference"


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class PlainGPT(nn.Module):
    """nanoGPT (Karpathy): token + learned position embeddings, pre-LN blocks, tied head."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.n_layer, self.d_model = n_layer, d_model

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12·L·d·T (PaLM, appendix B), N without the position table (a lookup, not a matmul)."""
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * self.n_layer * self.d_model * seq_len
