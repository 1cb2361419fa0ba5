"""A decoder-only, pre-norm GPT whose only positional machinery is its encoding.

nanoGPT's shape: CausalSelfAttention, MLP, Block (posenc/nn/blocks.py), GPT. The block recipe
(norm, MLP, biases, tied head, init) is a flavour (posenc/nn/flavors.py): ``gpt2`` is nanoGPT's,
``llama`` is RMSNorm, SwiGLU, no biases and an untied head. The model owns one encoding (or one
per layer kind, posenc/nn/layout.py) and a layer layout (each layer's window). Once per forward it
builds the context (positions, per sequence under documents packing, and each layer's mask),
asks for each layer kind's bias and mask once (shared by its layers, as T5 shares its bias) and
hands every block its encoding, which ``transform_qk`` q and k. Nothing here knows an encoding's name.

The model owns its run's kernel policy (``kernels``, posenc/nn/kernels.py): built fresh with the
model, so each run (a sweep's job, a bench's model) starts from the same kernel state; it holds the
layer kinds, known here when the model is built, and ``planned`` says, outside any compiled trace,
which path each layer kind takes for a batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn import fla_kernels
from posenc.nn.attention import Plan, plans
from posenc.nn.blocks import MLP, Block, CausalSelfAttention, RMSNorm, SwiGLU, make_norm
from posenc.nn.decoding import KVCache
from posenc.nn.encodings.base import Context, PositionalEncoding, head_dim
from posenc.nn.encodings.cache import step_context
from posenc.nn.flavors import Flavor, get_flavor, init_stds
from posenc.nn.kernels import LINEAR, KernelPolicy, LayerKind
from posenc.nn.layout import LayerLayout
from posenc.nn.mask import AttentionMask, document_positions
from posenc.nn.recurrence import CHUNK

__all__ = ["ATTENTIONS", "GPT", "Block", "CausalSelfAttention", "MLP", "RMSNorm", "SwiGLU"]


ATTENTIONS = ("softmax", "linear")


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
        flavor: str | Flavor = "gpt2",
        norm: str | None = None,
        mlp: str | None = None,
        bias: bool | None = None,
        tie_embeddings: bool | None = None,
        init: str | None = None,
        layout: LayerLayout | None = None,
    ) -> None:
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"model.attention must be one of {', '.join(ATTENTIONS)}, got '{attention}'")
        for key, value in (("vocab_size", vocab_size), ("n_layer", n_layer), ("n_head", n_head), ("d_model", d_model)):
            if value <= 0:
                raise ValueError(f"model.{key} must be positive, got {value}")
        head_dim(d_model, n_head)  # refuses a d_model that n_head does not divide
        self.layout = layout or LayerLayout.uniform(n_layer)
        if len(self.layout.kinds) != n_layer:
            raise ValueError(f"the layer layout has {len(self.layout.kinds)} layers, the model {n_layer}")
        if attention == "linear":
            scored = [l for l in range(n_layer) if encoding.for_layer(l).needs_scores]
            if scored:
                raise ValueError(
                    f"model.attention=linear has no score matrix or softmax for encoding "
                    f"'{encoding.for_layer(scored[0]).name}' to act on — use a rotary, additive or no encoding "
                    f"(e.g. encoding=rope) or model.attention=softmax")
            if self.layout.limited:
                raise ValueError("model.attention=linear has no mask to limit to a window — use layout=uniform "
                                 "or model.attention=softmax")
        recurrent = [l for l in range(n_layer) if self.layout.mixer(l) != "softmax"]
        scored = [l for l in recurrent if encoding.for_layer(l).needs_scores]
        if scored:
            raise ValueError(
                f"the {self.layout.kinds[scored[0]]} layers are {self.layout.mixer(scored[0])} layers, which have no "
                f"score matrix for encoding '{encoding.for_layer(scored[0]).name}' to act on — give "
                f"layout.kinds.{self.layout.kinds[scored[0]]}.encoding a rotary or no encoding")
        # each switch that is not None replaces that component of the flavour (recipe ablations)
        self.flavor = get_flavor(flavor, norm=norm, mlp=mlp, bias=bias, tie_embeddings=tie_embeddings, init=init)
        self.vocab_size = vocab_size
        self.n_layer = n_layer
        self.d_model = d_model
        self.encoding = encoding
        self.wte = nn.Embedding(vocab_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout, attention, self.flavor, self.layout.mixer(layer))
                                    for layer in range(n_layer))
        self.ln_f = make_norm(d_model, self.flavor)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if self.flavor.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf, 2017)
        self._init_weights(n_layer)
        self.kernels = KernelPolicy.for_layers(self.layer_kinds())

    @property
    def kernels(self) -> KernelPolicy:
        """The run's kernel policy (module doc): what each layer kind runs and what fell back."""
        return self._kernels

    @kernels.setter
    def kernels(self, policy: KernelPolicy) -> None:
        self.__dict__["_kernels"] = policy  # a plain attribute, not a submodule
        for kind in policy.kinds.values():
            if kind.mixer == LINEAR:  # one path, whatever the device
                policy.ran.saw(kind.name, LINEAR)
        for layer, block in enumerate(self.blocks):  # a recurrent mixer asks it whether fla may run
            if not isinstance(block.attn, CausalSelfAttention):
                block.attn.kernels, block.attn.kind = policy, self.layout.kinds[layer]

    def layer_kinds(self) -> list[LayerKind]:
        """The layout's kinds: their layers, encoding and mixer (linear attention: ``linear``)."""
        kinds: dict[str, list[int]] = {}
        for layer, kind in enumerate(self.layout.kinds):
            kinds.setdefault(kind, []).append(layer)
        return [LayerKind(kind, tuple(layers), self.encoding.for_layer(layers[0]).name,
                          self.mixer_of(layers[0])) for kind, layers in kinds.items()]

    def mixer_of(self, layer: int) -> str:
        block = self.blocks[layer].attn
        return LINEAR if getattr(block, "attention", None) == LINEAR else self.layout.mixer(layer)

    @property
    def attending(self) -> list[int]:
        """The layers that attend with softmax (the ones attention plans for)."""
        return [layer for layer in range(self.n_layer) if self.mixer_of(layer) == "softmax"]

    def _init_weights(self, n_layer: int) -> None:
        """N(0, σ) for matmul weights (σ from the flavour's init scheme), σ/√(2L) on residual projections (GPT-2: each of
        the 2L residual branches adds variance), zero biases; the encoding initialises its own."""
        f = self.flavor
        std, embed_std, head_std = init_stds(f, self.d_model)
        nn.init.normal_(self.wte.weight, mean=0.0, std=embed_std if not f.tie_embeddings else std)
        for module in self.blocks.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for name, p in self.blocks.named_parameters():
            if name.endswith("c_proj.weight"):  # scaled init of residual projections (GPT-2)
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * n_layer))
        if not f.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=head_std)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6N + 12·L·d·T (PaLM, appendix B; nanoGPT's estimate_mfu).

        N counts the parameters on the matmul path (with nanoGPT, the small bias and norm
        vectors too): a tied embedding once (as the output head), an untied head once; the
        untied embedding and a learned position table do not count (they are lookups). A recurrent
        layer's 12·d·T becomes 12·d·C for its chunks of C tokens plus 12·d·d_h for reading and
        writing its d_h x d_h state per head (posenc/nn/recurrence.py).
        """
        lookups = ("encoding.",) if self.flavor.tie_embeddings else ("encoding.", "wte.")
        n = sum(p.numel() for name, p in self.named_parameters() if not name.startswith(lookups))
        mixing = sum(seq_len if self.layout.mixer(layer) == "softmax"
                     else min(CHUNK, seq_len) + self.d_model // self.blocks[layer].attn.n_head
                     for layer in range(self.n_layer))
        return 6 * n + 12 * self.d_model * mixing

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, pos: Tensor | None = None, doc: Tensor | None = None,
        length: int | None = None, cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """idx: (B, T) token ids; targets: (B, T) or None; pos: (T,) or (B, T) positions, default
        0..T-1; doc: (B, T) document ids within each window (documents packing: no token
        attends across a document, positions restart at 0 in each, unless pos says otherwise);
        length: a bound on max(pos) + 1 known on the host (saves a device sync); cache: decoding
        (``new_cache``, posenc/nn/decoding.py): empty, idx is a prompt at positions 0..T-1, computed as
        without a cache and kept in it; holding n tokens, idx are the next ones, at positions n..n+T-1.

        Returns logits (B, T, vocab) and the mean cross-entropy (nats/token) if targets.
        """
        if cache is not None and (pos is not None or doc is not None):
            raise ValueError("decoding runs one sequence from position 0: give no pos or doc with a cache")
        if cache is None or not cache.length:
            x = self.hidden(idx, pos, doc, length, cache)
        elif self.encoding.cache_epoch(cache.length + idx.shape[1]) != cache.epoch:
            # what the cache keeps depends on the length and is stale (dynamic NTK beyond its original
            # length): the whole sequence again, kept afresh
            self.encoding.prepare(cache.length + idx.shape[1])  # refuses before the cache is touched
            tokens = torch.cat((cache.tokens, idx), dim=1)
            cache.restart(self.new_cache())
            x = self.hidden(tokens, None, None, None, cache)[:, -idx.shape[1]:]
        else:
            x = self.decode_step(idx, cache)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def hidden(self, idx: Tensor, pos: Tensor | None, doc: Tensor | None, length: int | None,
               cache: KVCache | None = None) -> Tensor:
        """The last blocks' output (B, T, C) of ``forward``'s arguments; an empty cache keeps what decoding needs."""
        ctx = self.context(idx, pos, doc, length)
        self.encoding.prepare(ctx.n_positions)
        if cache is not None:
            cache.append(idx)
            cache.epoch = self.encoding.cache_epoch(ctx.n_positions)
        x = self.encoding.embed(self.wte(idx), ctx)  # (B, T, C)
        x = self.drop(x)
        # each layer kind's bias and mask are built once per forward and shared by its layers
        layer_plans = plans(self.encoding, ctx, self.n_layer, self.drop.p if self.training else 0.0, self.kernels,
                            self.attending)
        for layer, block in enumerate(self.blocks):
            x = block(x, self.encoding.for_layer(layer), ctx, layer_plans[layer], layer,
                      cache.layers[layer] if cache is not None else None)
        return x

    def new_cache(self) -> KVCache:
        """An empty decoding cache for this model: each layer keeps what its mixer and encoding say
        (posenc/nn/decoding.py); ``forward(prompt, cache=c)`` fills it, ``forward(next, cache=c)`` decodes."""
        layers = [block.attn.new_cache(self.encoding.for_layer(layer), layer, self.layout.window(layer))
                  for layer, block in enumerate(self.blocks)]
        return KVCache(layers, self.encoding.cache_holds())

    def decode_step(self, idx: Tensor, cache: KVCache) -> Tensor:
        """The last hidden states (B, t, C) of the next tokens idx (B, t) after the cache's n, at positions
        n..n+t-1: each block attends to what its cache keeps. The embedding of the new tokens alone where
        the encoding's cache holds, else of the whole prefix (an embed that reads the past)."""
        n0 = cache.length
        n1 = n0 + idx.shape[1]
        self.encoding.prepare(n1)  # refuses a position beyond max_len, grows the tables
        dtype = self.compute_dtype(idx.device)
        ctx = step_context(n0, n1, dtype, idx.device)
        tokens = cache.append(idx)
        if cache.embeds_alone:
            x = self.encoding.embed(self.wte(idx), ctx)
        else:
            x = self.encoding.embed(self.wte(tokens), Context.arange(n1, idx.device, dtype))[:, n0:]
        for layer, block in enumerate(self.blocks):
            x = block(x, self.encoding.for_layer(layer), ctx, None, layer, cache.layers[layer])
        return x

    @torch.no_grad()
    def planned(self, idx: Tensor, pos: Tensor | None = None, doc: Tensor | None = None,
                length: int | None = None) -> list[Plan]:
        """Each layer's plan for a forward on idx (as ``forward`` takes it, under the caller's autocast),
        made outside any compiled trace: what a compiled forward plans, known to the train step that
        recovers from its failure (posenc/train/state.py). Each layer kind's path is recorded in
        ``kernels`` (a recurrent kind's as its first use in this run found it)."""
        ctx = self.context(idx, pos, doc, length)
        self.encoding.prepare(ctx.n_positions)
        out = plans(self.encoding, ctx, self.n_layer, self.drop.p if self.training else 0.0, self.kernels,
                    self.attending)
        for kind in self.kernels.kinds.values():
            if kind.mixer not in ("softmax", LINEAR):
                self.kernels.ran.saw(kind.name, fla_kernels.path(kind.mixer, idx.device.type, self.kernels))
        return out

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """What the forward computes in on device: autocast's dtype where it is on, else the weights'."""
        return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else self.wte.weight.dtype

    def context(self, idx: Tensor, pos: Tensor | None, doc: Tensor | None, length: int | None) -> Context:
        """The per-forward context every hook sees: positions, documents and each layer's mask."""
        dtype = self.compute_dtype(idx.device)
        T = idx.shape[1]
        if doc is not None and any(block.attn.attention == "linear" for block in self.blocks):
            raise ValueError("model.attention=linear has no mask to keep documents apart — use "
                             "dataset.packing=concat or bos_aligned, or model.attention=softmax")
        if doc is not None and pos is None:
            pos, length = document_positions(doc), length or T  # positions restart in every document
        masks: tuple[AttentionMask, ...] = ()
        if doc is not None or self.layout.limited:
            # one mask per distinct window, keyed by its fields: a Window as a key (or dict.fromkeys) is a
            # graph break in torch 2.6 and 2.7's dynamo
            shared = {(w.size, w.chunked): AttentionMask(T, doc, w) for w in self.layout.windows.values()}
            windows = [self.layout.window(layer) for layer in range(self.n_layer)]
            masks = tuple(shared[w.size, w.chunked] for w in windows)
        if pos is None:
            return Context.arange(T, idx.device, dtype, doc, masks)
        # explicit positions without a known bound cost one host sync, by request
        return Context.at(pos, dtype, doc, masks, length)
