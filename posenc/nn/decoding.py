"""Decoding with a cache: the prompt run once through the model (the prefill, on the forward's own
kernels), then one token at a time, each layer keeping what its token mixer needs of the past.

An attention layer keeps what its encoding says (``kv_cache``, posenc/nn/encodings/cache.py) and
gives the new queries' rows (``Rows``), which ``attend_cached`` normalises and applies as the
explicit-mask path does (SDPA on the row, or the weights written out where softmax or q·k is
replaced, a sink as one more key). Where the encoding keeps nothing of its own, or its cache was not
written for a hook it overrides (``cache_holds``), the layer keeps its raw q, k, v and block input
and asks every hook over the whole prefix (``Recompute``): what the full forward computes, for any
causal encoding, at O(T) hook work per token. A recurrent layer carries its state and its short
convolution's last inputs (posenc/nn/recurrent.py); a layer no cache is written for (linear attention)
keeps its block input and runs over the prefix (``InputRecompute``).

``KVCache`` is a batch's state: the layers' caches and the tokens so far; ``GPT.forward(idx,
cache=...)`` fills it (an empty cache: idx is the prompt) and decodes with it (idx the next tokens).
``generate`` is the loop, ``sample`` one draw (greedy at temperature 0). What each encoding keeps, what
it costs and its caveats: docs/decoding.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch import Tensor

from posenc.nn.attention import encode
from posenc.nn.context import Context
from posenc.nn.dense import DensePlan, LayerTerms, attend_rows, float_mask, with_terms
from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.encodings.cache import LayerCache, Rows, cat
from posenc.nn.mask import AttentionMask, Window


class LayerState(Protocol):
    """What every layer's cache answers: tokens seen, memory kept, and what it keeps in words."""

    length: int

    def nbytes(self) -> int: ...

    def describe(self) -> str: ...


def layer_cache(encoding: PositionalEncoding, layer: int, window: Window) -> LayerCache:
    """An attention layer's cache: its encoding's own where it holds (``cache_holds``), else ``Recompute``."""
    cache = encoding.kv_cache(layer, window) if encoding.cache_holds() else None
    return cache if cache is not None else Recompute(encoding, layer, window)


class Recompute(LayerCache):
    """The layer's raw q, k, v and block input x of every token: the new rows are computed by the
    encoding's hooks over the whole prefix (``encode``, the explicit-mask plan's rows for the new
    queries), as the forward computes them. Nothing is dropped under a window: a hook may read tokens
    before the oldest key (PaTH's short convolution)."""

    keeps = "raw q, k, v and block input (every hook asked over the prefix)"

    def __init__(self, encoding: PositionalEncoding, layer: int, window: Window) -> None:
        super().__init__(encoding, layer, window)
        self.q = self.k = self.v = self.x = None

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> None:
        self.q, self.k, self.v, self.x, self.length = q, k, v, ctx.x, ctx.T

    def extend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> Rows:
        n0 = self.length
        self.q, self.k, self.v, self.x = cat(self.q, q), cat(self.k, k), cat(self.v, v), cat(self.x, ctx.x, dim=1)
        n1 = self.length = n0 + q.shape[-2]
        mask = AttentionMask(n1, None, self.window)
        prefix = Context.arange(n1, q.device, ctx.dtype, None, (mask,) * (self.layer + 1)).with_input(self.x)
        qt, kt, terms = encode(self.encoding, self.q, self.k, prefix, self.layer)
        lo = self.window.first_key(n0)
        bias = self.encoding.position_bias if self.encoding.offers("position_bias") else None
        rows = with_terms(DensePlan(mask, bias, prefix.pos, ctx.dtype).rows(n0, n1, lo), terms, n0, lo)
        scores = terms.scores(n0, n1, lo) if terms.scores is not None else None
        return Rows(qt[..., n0:, :], kt[..., lo:, :], self.v[..., lo:, :], n0, lo,
                    float_mask(rows, torch.promote_types(q.dtype, torch.float32)), scores, terms.sink, terms.normalise)

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.q, self.k, self.v, self.x) if t is not None]


def attend_cached(rows: Rows, window: Window) -> Tensor:
    """The new queries' attention from a cache's rows: (B, H, t, Ev). The layer's mask (causal among the
    new tokens, the window) hides keys; the rest is the explicit-mask path's ``attend_rows``."""
    end = rows.q_start + rows.q.shape[-2]
    visible = AttentionMask(end, None, window).visible(rows.q_start, end, rows.k_start, end, device=rows.q.device)
    mask = visible if rows.terms is None else rows.terms.masked_fill(~visible, float("-inf"))
    scores = rows.scores
    terms = LayerTerms(scores=None if scores is None else (lambda start, stop, lo: scores), sink=rows.sink,
                       normalise=rows.normalise)
    return attend_rows(rows.q, rows.k, rows.v, mask, terms, rows.q_start, rows.k_start, 0.0)


class InputRecompute:
    """A token mixer's block input x (B, n, C) of every token: for new tokens the layer runs over the
    whole prefix and the new rows are kept. For a layer no cache is written for (linear attention), or a
    recurrent layer whose encoding's cache does not hold."""

    keeps = "block input (the layer run over the prefix)"

    def __init__(self) -> None:
        self.x: Tensor | None = None
        self.length = 0

    def prefill(self, x: Tensor) -> None:
        self.x, self.length = x, x.shape[1]

    def extend(self, x: Tensor, dtype: torch.dtype, run: Callable[[Tensor, Context], Tensor]) -> Tensor:
        """x (B, t, C) the new tokens' input; run(x, ctx): the layer over a whole prefix -> (B, t, C)."""
        n0 = self.length
        self.x = cat(self.x, x, dim=1)
        self.length = self.x.shape[1]
        return run(self.x, Context.arange(self.length, x.device, dtype))[:, n0:]

    def nbytes(self) -> int:
        return 0 if self.x is None else self.x.numel() * self.x.element_size()

    def describe(self) -> str:
        return self.keeps


class KVCache:
    """One batch's decoding state: each layer's cache and the tokens so far (B, n).

    embeds_alone: the encoding's ``embed`` is computed for the new tokens alone (its cache holds);
    otherwise the prefix is embedded again for each new token and its last rows kept."""

    def __init__(self, layers: list[LayerState], embeds_alone: bool) -> None:
        self.layers = layers
        self.embeds_alone = embeds_alone
        self.tokens: Tensor | None = None
        #: what the kept state depends on beyond the tokens (``PositionalEncoding.cache_epoch``)
        self.epoch: object = None
        #: how often the whole sequence was run again because that changed
        self.restarts = 0

    def restart(self, empty: KVCache) -> None:
        """Forget everything kept (the layers of ``empty``, a new cache of the same model): the next
        forward runs the whole sequence again."""
        self.layers, self.tokens = empty.layers, None
        self.restarts += 1

    @property
    def length(self) -> int:
        """Tokens seen (0: the next forward is the prompt's)."""
        return 0 if self.tokens is None else self.tokens.shape[1]

    def append(self, idx: Tensor) -> Tensor:
        """The tokens so far with idx (B, t) appended: (B, n + t)."""
        self.tokens = cat(self.tokens, idx, dim=1)
        return self.tokens

    def nbytes(self) -> int:
        """The layers' caches' memory (the tokens' ids are not counted: every decoder keeps them)."""
        return sum(layer.nbytes() for layer in self.layers)

    def describe(self) -> list[str]:
        """What each layer keeps, in words: one entry per distinct description, with its layers."""
        kinds: dict[str, list[int]] = {}
        for layer, state in enumerate(self.layers):
            kinds.setdefault(state.describe(), []).append(layer)
        if len(kinds) == 1:
            return list(kinds)
        return [f"layers {','.join(map(str, layers))}: {what}" for what, layers in kinds.items()]


def sample(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> Tensor:
    """One token per row: logits (B, V) -> (B, 1) long. Temperature 0 is greedy (argmax); otherwise a
    draw from softmax(logits / temperature) over the top_k largest (all where None), from generator."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.double() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


class Decoder(Protocol):
    """What ``generate`` asks of a model (posenc/nn/model.py's GPT): an empty cache, and a forward with one."""

    def new_cache(self) -> KVCache: ...

    def __call__(self, idx: Tensor, *, cache: KVCache) -> tuple[Tensor, Tensor | None]: ...


@torch.no_grad()
def generate(model: Decoder, prompt: Tensor, max_new_tokens: int,
             pick: Callable[[Tensor], Tensor] = lambda logits: logits.argmax(-1, keepdim=True),
             ) -> Iterator[tuple[Tensor, Tensor]]:
    """Decode with a cache: prompt (B, T) prefilled, then max_new_tokens tokens chosen by pick(logits)
    ((B, V) -> (B, 1), greedy by default). Yields each new token (B, 1) with the logits it was chosen
    from (B, V), as it is chosen."""
    cache = model.new_cache()
    logits = model(prompt, cache=cache)[0][:, -1]
    for step in range(max_new_tokens):
        token = pick(logits)
        yield token, logits
        if step + 1 < max_new_tokens:
            logits = model(token, cache=cache)[0][:, -1]
