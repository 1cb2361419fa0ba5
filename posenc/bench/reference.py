"""The plain reference of `posenc bench`: the recipe's block written plainly, nothing else.

The smallest honest baseline at the same recipe: a block stack written here from torch's own
modules, with nanoGPT's learned absolute positions and SDPA's causal kernel, at the same shape
and trained by the same train_step. Under ``gpt2`` it is nanoGPT's model (Karpathy); under
``llama`` Meta's Llama block (RMSNorm, SwiGLU as three bias-free linears w2·(SiLU(w1·x) ⊙ w3·x),
untied head); each recipe switch (``model.norm``, ``model.mlp``, ...) switches the same component
here. posenc's ratio to it is the price of the framework, separate from the price of the encoding
and of the recipe: a posenc model is never compared with a reference of another recipe.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor, nn

from posenc.nn.flavors import SWITCHES, Flavor, get_flavor, swiglu_hidden

REFERENCE = "reference"


def recipe_of(model_cfg: DictConfig) -> Flavor:
    """The recipe posenc's models take from ``cfg.model``: the flavour with its switches applied
    ('llama', 'gpt2+norm=rmsnorm')."""
    return get_flavor(model_cfg.flavor, **{switch: model_cfg.get(switch) for switch in SWITCHES})


def plain_norm(d: int, flavor: Flavor) -> nn.Module:
    return nn.RMSNorm(d, eps=1e-6) if flavor.norm == "rmsnorm" else nn.LayerNorm(d, bias=flavor.bias)


class PlainMLP(nn.Module):
    """GELU: c_proj·GELU(c_fc·x), hidden 4d (nanoGPT); SwiGLU: w2·(SiLU(w1·x) ⊙ w3·x), hidden 8d/3 (Llama)."""

    def __init__(self, d: int, flavor: Flavor) -> None:
        super().__init__()
        swiglu = flavor.mlp == "swiglu"
        hidden = swiglu_hidden(d) if swiglu else 4 * d
        self.w1, self.w2 = nn.Linear(d, hidden, bias=flavor.bias), nn.Linear(hidden, d, bias=flavor.bias)
        self.w3 = nn.Linear(d, hidden, bias=flavor.bias) if swiglu else None

    def forward(self, x: Tensor) -> Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int, flavor: Flavor) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = plain_norm(d, flavor), plain_norm(d, flavor)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=flavor.bias), nn.Linear(d, d, bias=flavor.bias)
        self.mlp = PlainMLP(d, flavor)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    """Token + learned position embeddings, pre-norm blocks of the recipe, its head (tied or not)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int,
                 flavor: Flavor) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, n_head, flavor) for _ in range(n_layer))
        self.ln_f = plain_norm(d_model, flavor)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.tied = flavor.tie_embeddings
        if self.tied:
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
        """6N + 12·L·d·T (PaLM, appendix B), N without the lookups (the position table, an untied
        token embedding), as posenc's models count it."""
        lookups = ("wpe.",) if self.tied else ("wpe.", "wte.")
        n = sum(p.numel() for name, p in self.named_parameters() if not name.startswith(lookups))
        return 6 * n + 12 * self.n_layer * self.d_model * seq_len
