"""The plain reference of `posenc bench`: the recipe's block written plainly, nothing else.

The smallest honest baseline at the same recipe: a block stack written here from torch's own
modules, with nanoGPT's learned absolute positions and SDPA's causal kernel, at the same shape
and trained by the same train_step. Under ``gpt2`` it is nanoGPT's model (Karpathy); under
``llama`` Meta's Llama block (RMSNorm, SwiGLU as three bias-free linears w2·(SiLU(w1·x) ⊙ w3·x),
untied head); each recipe switch (``model.norm``, ``model.mlp``, ...) switches the same component
here. posenc's ratio to it is the price of the framework, separate from the price of the encoding
and of the recipe: a posenc model is never compared with a reference of another recipe.

It decodes as nanoGPT-style decoders do (``PlainCache``: each block's keys and values concatenated,
the new query attending to all of them through SDPA): the reference of `bench.decode`'s rows
(posenc/bench/decode.py).
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

    def forward(self, x: Tensor, cache: PlainCache | None = None, layer: int = 0) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        past = cache is not None and cache.length > 0
        if cache is not None:  # the keys and values so far, these appended: (B, H, n + T, hd)
            k, v = cache.keep(layer, k, v)
        # one new token sees every key; a prompt is causal among itself (decoding feeds one token at a time)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=not past).transpose(1, 2).contiguous().view(B, T, C)
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

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                cache: PlainCache | None = None) -> tuple[Tensor, Tensor | None]:
        start = cache.length if cache is not None else 0
        x = self.wte(idx) + self.wpe(torch.arange(start, start + idx.shape[1], device=idx.device))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += idx.shape[1]
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


class PlainCache:
    """The reference's KV cache: each block's keys and values (B, H, n, hd), a token appended at a time."""

    def __init__(self, n_layer: int) -> None:
        self.keys: list[Tensor | None] = [None] * n_layer
        self.values: list[Tensor | None] = [None] * n_layer
        self.length = 0

    def keep(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Block ``layer``'s keys and values with k, v (B, H, t, hd) appended."""
        if self.keys[layer] is not None:
            k, v = torch.cat((self.keys[layer], k), dim=-2), torch.cat((self.values[layer], v), dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)
