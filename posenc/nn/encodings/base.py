"""The one abstraction: a positional encoding.

Every encoding in the literature acts in one (or more) of these places, so the base class
has one hook for each, a no-op by default:

- ``embed(x, ctx)``: added to the token embeddings before the first block (sinusoidal, learned);
- ``transform_qk(q, k, ctx, layer)``: a position-dependent map of queries and keys, applied
  before q·k (RoPE's rotation; xPos's rotation and decay; PoPE's polar magnitudes; a per-layer
  choice such as RoPE/NoPE hybrids). Not only rotations: anything q and k go through;
- ``distance_bias(distance)``: a term added to the attention logits that depends on positions only
  through the distance n = i - j, as a table over n (T5's relative bias, ALiBi, Kerple): overriding
  it makes the encoding *relative* (shift-invariant, computed at window indices under documents
  packing), and it is the one form the encoding writes: the dense ``position_bias`` and the fused
  kernel's ``score_mod`` are derived from it (a closed form may still override either, for speed);
- ``position_bias(q_pos, k_pos)``: a logit term from positions alone, (..., H, Tq, Tk), computed once
  per forward and shared by all layers (a layer-specific bias comes from a layout's ``for_layer``):
  override it for a bias of i and j apart (FIRE's, which divides by the query's position), with a
  ``score_mod`` for the fused kernel;
- ``content_bias(q, k, ctx, layer)``: a logit term that depends on q and k themselves
  (CoPE's contextual positions), computed in each layer;
- ``qk_scores(q, k, ctx, layer)``: replaces the bilinear form q_i·k_j itself, for a position
  that cannot be written as a map of q and k alone (PaTH's data-dependent product of
  Householder transforms between key j and query i), computed in each layer as row blocks.

Position also enters through the attention itself (the 2024-25 mechanisms), each one more
optional hook, computed in each layer:

- ``decay(ctx, layer)``: cumulative log-decays c (B, H, T); the logit of query i and key j
  gains c_i - c_j = Σ_{t=j+1..i} log f_t (the Forgetting Transformer's data-dependent
  forget gates): O(T) memory, a FlexAttention score_mod on CUDA;
- ``logit_scale(ctx, layer)``: a per-query factor on q_i·k_j/√d (SSMax's s·log n with n the
  keys the query sees, Llama 4's attention temperature);
- ``sink_logit(layer)``: a per-head logit that joins the softmax's denominator with a zero
  value (attention sinks: GPT-OSS);
- ``normalise(scores, q_idx, k_idx)``: replaces softmax itself (stick-breaking attention);
- ``fused_attention(ctx, layer)``: a kernel of the encoding's own for a layer's whole attention, equal
  to what the hooks above define (flash-linear-attention's FoX, PaTH, stick-breaking kernels: posenc/nn/fla_kernels.py).

Decoding asks one more, ``kv_cache(layer, window)``: what a layer keeps of every token to decode the
next (keys at their positions by default; ``Decodes``, posenc/nn/encodings/cache.py).

Every hook works with the per-forward ``Context``: positions shared by the batch (T,) or per
sequence (B, T) (documents packing: they restart at 0 in every document), document ids, and each
layer's attention mask (causal ∧ same document ∧ window, posenc/nn/mask.py). Inside a block the
context also carries the block's input x (``with_input``), so a hook may depend on the tokens
(FoX's gates). Which keys a query sees is the mask's job, never the encoding's; a hook that sums
or counts over keys (CoPE, SSMax) asks the mask. A layout may give each layer kind its own
encoding (posenc/nn/layout.py): the model asks ``for_layer``. A mechanism that wraps another
encoding (posenc/nn/encodings/mechanism.py) passes every hook through and adds its own.

The base class itself is NoPE: no positional information at all, which a causal decoder can
still infer from the mask (Haviv et al., 2022; Kazemnejad et al., 2023). What an encoding offers is
*derived* from which hooks it overrides, asked with one query, ``offers(hook)`` (a position bias is
offered by overriding ``position_bias`` or ``distance_bias``): no flag to remember, and attention
never asks which encoding it has. Its options are the arguments its constructor was called with
(``options``). The vocabulary and ``Context``: posenc/nn/context.py.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.nn.encodings.cache import Decodes
from posenc.nn.context import (  # noqa: F401 - re-exported
    Context,
    FusedAttention,
    KernelUnavailable,
    Normaliser,
    ScoreMod,
    ScoreRows,
    distance_position_bias,
    distance_score_mod,
    positions_at,
)
from posenc.nn.encodings.options import (  # noqa: F401
    BUILDER_ARGUMENTS,
    OPTIONS,
    outermost_encodings,
    recording_arguments,
    with_subclass_arguments,
)

#: an encoding parameter group's optimiser options, and their defaults: trainer.lr × lr_scale, and
#: no weight decay (an encoding's own parameters are not pulled to zero while they learn)
GROUP_DEFAULTS: dict[str, float] = {"lr_scale": 1.0, "weight_decay": 0.0}
ParamGroup = tuple[list[nn.Parameter], dict[str, float]]

#: the hooks an encoding may override; ``offers(hook)`` says whether it acts through one
HOOKS = ("embed", "transform_qk", "position_bias", "distance_bias", "content_bias", "qk_scores", "decay",
         "logit_scale", "sink_logit", "normalise", "rotary_frequencies", "fused_attention")


def head_dim(d_model: int, n_head: int) -> int:
    """d_model / n_head, the width of one head: the one place a model and its encodings split it."""
    if d_model % n_head != 0:
        raise ValueError(f"model.d_model={d_model} is not divisible by model.n_head={n_head}")
    return d_model // n_head


class PositionalEncoding(Decodes, nn.Module):
    """Base class and NoPE. Subclasses override the hooks they need (see the module doc).

    Args:
        d_model: model width (what ``embed`` adds to).
        n_head: number of attention heads (what ``position_bias`` is per).
        name: the encoding's name in configs, tables and W&B.
    """

    #: longest sequence it can encode (positions 0..max_len-1); None means any length.
    max_len: int | None = None
    #: how many tokens before the oldest key a query sees its hooks read from the block's input
    #: (PaTH's short convolution reaches conv_size - 2 tokens behind key j through the transform
    #: at j + 1); 0 for an encoding that reads only the tokens of the window. It widens a sliding
    #: window's reach: through L layers a logit sees L·(w - 1 + reach) tokens back.
    reach: int = 0

    def __init_subclass__(cls, **kwargs) -> None:
        # a subclass's options are the arguments its constructor is called with: recorded as it is called
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = recording_arguments(cls.__init__)
        if "options" in cls.__dict__:  # its own choice of what to show, and a subclass's further arguments
            cls.options = with_subclass_arguments(cls.options, cls)

    def __init__(self, d_model: int, n_head: int, name: str = "nope") -> None:
        super().__init__()
        self.head_dim = head_dim(d_model, n_head)
        self.d_model = d_model
        self.n_head = n_head
        self.name = name

    # --- the hooks --------------------------------------------------------------------
    def embed(self, x: Tensor, ctx: Context) -> Tensor:
        """x: (B, T, d_model) token embeddings -> (B, T, d_model)."""
        return x

    def transform_qk(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, head_dim) of block ``layer`` -> q, k with position applied."""
        return q, k

    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """q_pos: (..., Tq), k_pos: (..., Tk) -> (..., H, Tq, Tk) additive logit bias b_h(i, j);
        leading dims are the batch when positions are per sequence (documents packing).

        By default ``distance_bias`` at each pair's distance i - j (``distance_position_bias``); override
        it for a bias of i and j apart, or a closed form. Only called where the encoding offers a bias
        (``offers("position_bias")``); it takes positions, not a context, so that long sequences can
        ask for one slice of queries at a time. Visibility (causal, documents, windows) is the mask's
        job, never the bias's."""
        if not self.overrides("distance_bias"):
            raise NotImplementedError
        return distance_position_bias(self.distance_bias, q_pos, k_pos)

    def content_bias(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> Tensor:
        """q, k: (B, H, T, head_dim) after ``transform_qk`` -> (B, H, T, T) additive logit term.
        Only called when a subclass overrides it (``offers("content_bias")``). ``ctx.mask(layer)``
        says which keys each query sees (a term that sums over keys must respect it)."""
        raise NotImplementedError

    def qk_scores(self, q: Tensor, k: Tensor, ctx: Context, layer: int = 0) -> ScoreRows:
        """Replaces q_i·k_j: q, k (B, H, T, head_dim) after ``transform_qk`` (q scaled by any logit
        scale) -> ``ScoreRows``, the scores s_ij that attention divides by √d and adds the other
        terms to. Attention then writes each row block's logits out (dense, or a block of queries
        at a time for long sequences); entries of hidden keys are ignored. Computed in each layer
        (ctx.x is the block's input). Only called when a subclass overrides it (``offers("qk_scores")``)."""
        raise NotImplementedError

    def decay(self, ctx: Context, layer: int = 0) -> Tensor | None:
        """Cumulative log-decays c: (B, H, T) float, non-increasing along T; the logit of query
        i and key j gains c_i - c_j = Σ_{t=j+1..i} log f_t. Computed in each layer (ctx.x is the
        block's input), offered to every kernel: rows of a dense mask on CPU, a score_mod over
        the captured c on CUDA. Only called when a subclass overrides it (``offers("decay")``)."""
        raise NotImplementedError

    def logit_scale(self, ctx: Context, layer: int = 0) -> Tensor | None:
        """τ: (B|1, H|1, T, 1) factors on q_i·k_j/√d, query by query (SSMax's s·log n_i, a length
        temperature), or None where this layer has none. Attention multiplies q by it, so every
        kernel stays as it is; position and content biases are added unscaled. Only called when
        a subclass overrides it (``offers("logit_scale")``)."""
        raise NotImplementedError

    def sink_logit(self, layer: int = 0) -> Tensor | None:
        """s: (H,) the logit of a sink, a key with a zero value that every query sees: its
        weight exp(s)/(Σ_j exp(z_ij) + exp(s)) is attention that goes nowhere. Only called when
        a subclass overrides it (``offers("sink_logit")``)."""
        raise NotImplementedError

    def normalise(self, scores: Tensor, q_idx: Tensor, k_idx: Tensor) -> Tensor:
        """Replaces softmax (``Normaliser``): scores (B, H, Tq, Tk), -inf on hidden keys, for
        queries at window indices q_idx (Tq,) and keys k_idx (Tk,) -> weights (B, H, Tq, Tk).
        Only called when a subclass overrides it (``offers("normalise")``)."""
        raise NotImplementedError

    def fused_attention(self, ctx: Context, layer: int = 0, log_gates: bool = False) -> FusedAttention | None:
        """A kernel of the encoding's own that computes block ``layer``'s whole attention in this forward
        (``FusedAttention``), or None where it has none for this context (device, ``ctx.dtype``, head dim,
        ``ctx.mask(layer)``, libraries installed): attention then computes it from the other hooks, which
        define what the kernel must equal. log_gates: the kernel must also add a wrapping mechanism's log
        forget gates. Asked once per forward for the layers sharing this encoding and mask (ctx.x is None
        here; the kernel is given the block's input). Only called when a subclass overrides it."""
        raise NotImplementedError

    # --- a relative bias, and the fused kernel's form of a bias --------------------------------
    def distance_bias(self, distance: Tensor) -> Tensor:
        """A position bias that depends on positions only through the distance n = i - j of query i
        and key j: distance (R,) long, any n >= 0 in any order -> (H, R), b_h(n) at each,
        differentiable in the encoding's parameters. Overriding it is the statement that the
        encoding is relative (``offers("distance_bias")``), and it must then return a table, never
        None: ``position_bias`` and ``score_mod`` are derived from it."""
        raise NotImplementedError

    def score_mod(self, ctx: Context) -> ScoreMod | None:
        """The position bias as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` that
        computes it per score, never as an H x T x T tensor; None where the encoding offers none.
        The default derives it from ``distance_bias``; a closed form may override it."""
        if not self.offers("distance_bias"):
            return None
        table = self.distance_bias(torch.arange(ctx.n_positions, device=ctx.device))  # (H, n_positions)
        return distance_score_mod(table, None if ctx.default_positions else ctx.pos)

    # --- what probes and figures may ask ------------------------------------------------
    def rotary_frequencies(self, layer: int = 0) -> Tensor | None:
        """For an encoding that rotates dimension pairs of q and k by m·θ_i in block ``layer``: θ
        (head_dim/2,) float, θ_i of pair i, 0 for a pair left unrotated, learned ones as they are
        now; pair i is dims (2i, 2i+1), or (i, i + rot_dim/2) where ``self.style == "half"``
        (``self.rot_dim``, the rotated width, defaults to head_dim). None (the default): no rotation
        in this layer. The rotary probe (posenc/eval/probes.py) reads it; figures draw it as rotary."""
        return None

    # --- derived facts ----------------------------------------------------------------
    def overrides(self, hook: str) -> bool:
        """Whether this encoding's class writes ``hook`` itself."""
        return getattr(type(self), hook) is not getattr(PositionalEncoding, hook)

    def offers(self, hook: str) -> bool:
        """Whether this encoding acts through ``hook`` (one of HOOKS): it overrides it, or, for
        ``position_bias``, ``distance_bias``, from which the dense bias is derived."""
        if hook not in HOOKS:
            raise ValueError(f"'{hook}' is not a hook of the encoding contract: one of {', '.join(HOOKS)}")
        return self.overrides(hook) or (hook == "position_bias" and self.overrides("distance_bias"))

    @property
    def needs_scores(self) -> bool:
        """Whether it acts on the score matrix itself (a bias, a logit term, its own q·k, a scale, a
        sink or a normaliser), which linear attention never forms."""
        return any(self.offers(h) for h in HOOKS if h not in ("embed", "transform_qk", "rotary_frequencies"))

    def for_layer(self, layer: int) -> PositionalEncoding:
        """The encoding block ``layer`` uses: itself, unless a layout gives layers their own."""
        return self

    def prepare(self, length: int) -> None:
        """Called once per forward, before any hook, with the number of positions needed
        (largest position + 1) as a Python int: refuse what cannot be encoded and grow any
        cache here, so the hooks themselves never synchronise with the device."""
        self.check_length(length)

    def check_length(self, length: int) -> None:
        """Refuse a sequence the encoding cannot represent, with a message a user can act on."""
        if self.max_len is not None and length > self.max_len:
            raise PositionOutOfRange(
                f"encoding '{self.name}' can encode positions 0..{self.max_len - 1} "
                f"(max_len={self.max_len}), but a sequence of length {length} was given — "
                f"use a shorter sequence or raise encoding.max_len"
            )

    def options(self) -> dict[str, object]:
        """The encoding's own options, for tables, summaries and W&B. By default the arguments its
        constructor was called with, defaults included (but the sizes the builder passes, and name),
        that hold plain values (numbers, strings, booleans, lists of them), as the call bound them
        (``recording_arguments``); override it to show something else (RoPE shows its scaling's keys
        only when it scales): a subclass's own further constructor arguments are still added after
        yours (``with_subclass_arguments``)."""
        return dict(self.__dict__.get(OPTIONS, {}))

    def param_groups(self) -> list[ParamGroup]:
        """The encoding's parameters as optimiser groups: (params, {"lr_scale": s, "weight_decay": w}),
        each option defaulting to GROUP_DEFAULTS (AdamW at trainer.lr·s, decoupled decay w). Override
        it to give a parameter its own learning rate or decay (a slope that must move faster than
        Adam's ~lr per step). The default: every parameter at the defaults, except those of an
        encoding nested in this one (a mechanism's ``inner``, a layout's kinds), which come as
        that encoding's own param_groups say."""
        nested = outermost_encodings(self, PositionalEncoding)
        groups = [group for encoding in nested for group in encoding.param_groups()]
        claimed = {id(p) for params, _ in groups for p in params}
        own = [p for p in self.parameters() if id(p) not in claimed]
        return [(own, {}), *groups] if own else groups

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options().items())
        return f"name={self.name}" + (f", {opts}" if opts else "")


class NoPE(PositionalEncoding):
    """No positional encoding: the causal mask is the only source of order."""


class PositionOutOfRange(ValueError):
    """A position beyond what the encoding can represent (e.g. learned beyond max_len)."""
