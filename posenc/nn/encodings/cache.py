"""What an attention layer keeps of the tokens it has seen, to decode the next one: the KV cache, as
each encoding defines it.

Decoding runs the prompt through the model once (the prefill, on the training forward's kernels)
and then a token at a time. Each attention layer keeps, per token, what its encoding needs to give
a new query its logits against the past without running the past again. What that is depends on
the encoding, and the encoding says it in one place, its ``kv_cache(layer, window)`` hook, which
returns a ``LayerCache``:

- ``KeysAtPositions`` (the base class's: NoPE's, and that of every encoding whose hooks it knows):
  the keys after ``transform_qk`` at their own positions, and the values. It holds where
  transform_qk is position-wise (q_i and k_i from q_i, k_i and position i alone: RoPE and its kin,
  PoPE, none); a position bias is asked for the new queries against the cached positions
  (``position_bias(q_pos, k_pos)`` for a slice of queries, as the chunked path asks it), a logit
  scale is read for the new rows from the prefix's positions and mask, and a sink and a normaliser
  act on the new rows. ALiBi, T5, Kerple and FIRE need nothing else: their bias is a function of
  the positions.
- a subclass of it, or a cache wrapping the inner encoding's, where the encoding keeps more: CoPE
  recounts its gates over the cached keys, FoX keeps its cumulative log gates c_j, PaTH carries the
  cached keys through each new token's Householder transform, xPos keeps its keys scaled about the
  prompt's centre, RoPE under a length-dependent scaling re-rotates them when the frequencies change.
- None: the encoding keeps nothing of its own, and decoding keeps the layer's raw q, k, v and block
  input and asks every hook over the whole prefix for the new rows (posenc/nn/decoding.py,
  ``Recompute``): what the full forward computes, for any causal encoding, at O(T) hook work a token.

A cache holds only for the hooks its author knew. ``holds(encoding)``: no hook a cache computes from
the new tokens alone (``INCREMENTAL``) is written by a class below the one that wrote ``kv_cache``,
so a subclass that changes one of them without saying what it keeps falls back to ``Recompute``
(a RoPE subclass that rotates otherwise is never decoded with RoPE's rotated keys).

Positions are window indices from 0: a prompt is one document. A cache keeps only the keys a later
query can see (``Window.first_key``: the last w of a sliding window, a chunked window's own chunk),
so a sliding layer's cache stays w tokens long however long the sequence grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from posenc.nn.context import Context, Normaliser
from posenc.nn.mask import AttentionMask, Window


class Hooks(Protocol):
    """What a cache asks of the encoding it serves (``PositionalEncoding``, posenc/nn/encodings/base.py,
    which mixes ``Decodes`` in: this module knows it by its hooks alone)."""

    def offers(self, hook: str) -> bool: ...

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int) -> tuple[Tensor, Tensor]: ...

    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor: ...

    def logit_scale(self, ctx: Context, layer: int) -> Tensor | None: ...

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None: ...

#: the hooks a cache computes for the new tokens alone: a class that writes one of them below the
#: class that wrote ``kv_cache`` decodes by recomputation (``holds``)
INCREMENTAL = ("embed", "transform_qk", "content_bias", "qk_scores", "decay", "logit_scale")


def writer(cls: type, name: str) -> int:
    """How far up cls's MRO the class that writes ``name`` stands (0: cls itself)."""
    return next(i for i, c in enumerate(cls.__mro__) if name in c.__dict__)


def holds(encoding: Hooks) -> bool:
    """Whether the cache ``encoding.kv_cache`` returns was written for every hook of INCREMENTAL the
    encoding has: none is written by a class below the one that wrote ``kv_cache`` (``Decodes``'s
    default stands for the base class that mixes it in, which writes the hooks' defaults)."""
    cls = type(encoding)
    owner = writer(cls, "kv_cache")
    if cls.__mro__[owner] is Decodes:
        owner -= 1
    return all(writer(cls, hook) >= owner for hook in INCREMENTAL)


def prefix_context(n: int, window: Window, layer: int, dtype: torch.dtype, device: torch.device) -> Context:
    """The context of a prefix of n tokens at positions 0..n-1, with layer ``layer``'s mask: what a hook
    read over the whole prefix (a logit scale's visible keys) is given."""
    mask = AttentionMask(n, None, window)
    return Context.arange(n, device, dtype, None, (mask,) * (layer + 1))


def step_context(start: int, end: int, dtype: torch.dtype, device: torch.device) -> Context:
    """The context of the new tokens start..end-1 alone, at their positions: what a position-wise hook
    (transform_qk, embed) is given while decoding."""
    return Context.at(torch.arange(start, end, device=device), dtype, n_positions=end)


@dataclass
class Rows:
    """The new queries' attention as a layer's cache gives it, for the caller to normalise and apply.

    q: (B, H, t, E) the new queries, transformed and scaled; k (B, H, S, E), v (B, H, S, Ev): the
    keys they may see, at window indices k_start..k_start+S-1 (the new tokens' own last); q_start:
    the first new query's index; terms: (B|1, H|1, t, S) added to q·k/√d (position bias, content,
    decays; hidden keys are the caller's to mask), or None; scores: (B, H, t, S) replacing q·k, or
    None; sink: (H,) or None; normalise: replaces softmax, or None."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_start: int
    k_start: int
    terms: Tensor | None = None
    scores: Tensor | None = None
    sink: Tensor | None = None
    normalise: Normaliser | None = None


def plus(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """a + b, where either may be absent."""
    if a is None or b is None:
        return b if a is None else a
    return a + b


def cat(kept: Tensor | None, new: Tensor, dim: int = -2) -> Tensor:
    """The kept tensor with the new tokens appended along dim (the new ones alone at the start)."""
    return new if kept is None else torch.cat((kept, new), dim=dim)


class LayerCache:
    """What one attention layer keeps of every token, and the new queries' rows against it.

    encoding: the layer's (outermost) encoding, asked for what every cache computes alike (the
    position bias, the logit scale, the sink, the normaliser); a mechanism's cache wrapping its inner
    encoding's is handed the mechanism (``retarget``). length: tokens seen; start: the window index
    of the oldest token kept."""

    #: what it keeps per token, in words (the check row and the bench show it)
    keeps: ClassVar[str] = ""

    def __init__(self, encoding: Hooks, layer: int, window: Window) -> None:
        self.encoding = encoding
        self.layer = layer
        self.window = window
        self.length = 0
        self.start = 0

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> None:
        """The prompt's raw projections q, k, v (B, H, T, hd) and its context (with the block's input
        x): keep what later queries need. The prompt's own attention is the forward's."""
        raise NotImplementedError

    def extend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> Rows:
        """The next tokens' raw q, k, v (B, H, t, hd) and their context (``step_context``, with x):
        keep them, and return the new queries' rows."""
        raise NotImplementedError

    def tensors(self) -> list[Tensor]:
        """Every tensor it keeps (its memory)."""
        return []

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def retarget(self, encoding: Hooks) -> LayerCache:
        """Ask ``encoding`` (a mechanism around this cache's encoding) for the common terms from now on."""
        self.encoding = encoding
        return self

    def describe(self) -> str:
        return self.keeps

    def kept(self, first: int) -> int:
        """How many of the kept tokens to drop so that the oldest is ``first``; ``start`` moves there."""
        drop = max(0, first - self.start)
        self.start += drop
        return drop


class KeysAtPositions(LayerCache):
    """The keys after ``transform_qk`` at their own positions, and the values (module doc)."""

    keeps = "keys at their positions, values"

    def __init__(self, encoding: Hooks, layer: int, window: Window) -> None:
        super().__init__(encoding, layer, window)
        self.keys: Tensor | None = None  # (B, H, S, E)
        self.values: Tensor | None = None  # (B, H, S, Ev)

    def transform(self, q: Tensor, k: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """q, k at the positions ctx gives (transform_qk, position-wise)."""
        return self.encoding.transform_qk(q, k, ctx, self.layer)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> None:
        _, k = self.transform(q, k, ctx)
        self.keys, self.values, self.length = k, v, ctx.T
        self.trim()

    def extend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context) -> Rows:
        n0 = self.length
        q, k = self.transform(q, k, ctx)
        self.keys, self.values = cat(self.keys, k), cat(self.values, v)
        self.length = n0 + q.shape[-2]
        rows = self.rows(q, n0, ctx)
        self.trim()
        return rows

    def trim(self) -> None:
        """Drop the keys no later query sees (the window's)."""
        drop = self.kept(self.window.first_key(self.length))
        if drop:
            self.dropped(drop)

    def dropped(self, drop: int) -> None:
        """Drop the oldest ``drop`` tokens of everything kept per token (a subclass adds what it keeps)."""
        self.keys, self.values = self.keys[..., drop:, :], self.values[..., drop:, :]

    def rows(self, q: Tensor, n0: int, ctx: Context, scores: Callable[[Tensor], Tensor] | None = None) -> Rows:
        """The new queries q (B, H, t, E, transformed) against the kept keys, with what the encoding adds
        in the contract's order: the content term from the unscaled q, the logit scale on q, the scores
        replacing q·k from the scaled q (``scores(q)``, a subclass's), the position bias, the sink and the
        normaliser."""
        n1 = self.length
        terms = plus(self.position_terms(n0, n1, q.device), self.content(q, n0))
        q = self.scaled(q, n0, ctx)
        s = scores(q) if scores is not None else None
        e = self.encoding
        return Rows(q, self.keys, self.values, n0, self.start, terms, s,
                    e.sink_logit(self.layer) if e.offers("sink_logit") else None,
                    e.normalise if e.offers("normalise") else None)

    def position_terms(self, n0: int, n1: int, device: torch.device) -> Tensor | None:
        """b_h(i, j) of the new queries n0..n1-1 against the kept keys: (1, H, t, S), or None."""
        if not self.encoding.offers("position_bias"):
            return None
        return self.encoding.position_bias(torch.arange(n0, n1, device=device),
                                           torch.arange(self.start, n1, device=device))[None]

    def content(self, q: Tensor, n0: int) -> Tensor | None:
        """A content term of the new queries (unscaled) against the kept keys, (B, H, t, S), or None
        (a subclass that keeps what its content bias needs)."""
        return None

    def scaled(self, q: Tensor, n0: int, ctx: Context) -> Tensor:
        """q (B, H, t, E) times the logit scale of rows n0..: read from the prefix's positions and mask."""
        if not self.encoding.offers("logit_scale"):
            return q
        prefix = prefix_context(self.length, self.window, self.layer, ctx.dtype, q.device)
        scale = self.encoding.logit_scale(prefix, self.layer)  # (B|1, H|1, n, 1) or None
        return q if scale is None else q * scale[..., n0:, :].to(q.dtype)

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.keys, self.values) if t is not None]


class Decodes:
    """The decoding half of the encoding contract, mixed into ``PositionalEncoding``: what a layer keeps
    of every token to decode the next one, and when what it keeps goes stale."""

    def kv_cache(self, layer: int, window: Window) -> LayerCache | None:
        """What block ``layer`` keeps of every token to decode the next one (module doc). By default the
        keys after ``transform_qk`` at their own positions and the values (``KeysAtPositions``), which
        hold for the base class's hooks with any position bias, sink or normaliser; an encoding that keeps
        more returns its own; None: nothing of its own, and decoding asks the hooks over the whole prefix
        for every new token (posenc/nn/decoding.py). Used only where ``cache_holds()``: a subclass that
        writes a hook of ``INCREMENTAL`` (transform_qk, a content bias, decays, ...) writes this too, or
        decodes by recomputation."""
        return KeysAtPositions(self, layer, window)

    def cache_holds(self) -> bool:
        """Whether ``kv_cache`` was written for every hook this encoding computes from the new tokens
        alone (``holds``); a mechanism's, only where its inner encoding's does too."""
        return holds(self)

    def cache_epoch(self, length: int) -> object:
        """What the kept state depends on beyond the tokens, for a sequence of ``length`` (None: nothing).
        Where it changes from one length to the next, decoding runs the whole sequence again (Hugging
        Face's dynamic NTK: every frequency changes with the length, and so every layer's past outputs)."""
        return None

    def stale_cache(self) -> str | None:
        """Why what a cache keeps goes stale as the sequence grows (the length from which, and what
        decoding does about it), or None: it stays valid. Shown by `posenc check` and the leaderboard;
        a full-window evaluation is unaffected."""
        return None
