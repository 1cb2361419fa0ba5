"""Which kernel computes a layer's attention, and the call. Kernels see an encoding only through what
it offers (a position bias, optionally as a FlexAttention ``score_mod``; per layer a content bias,
cumulative decays, a logit scale, a sink, a replaced normaliser, a kernel of its own) and the layer only
through its mask (posenc/nn/mask.py: causal, documents, a window).

Which kernel runs is chosen from those offers and from what the device can do (``plan``), never from
the encoding's name (docs/mechanisms.md):

- a kernel of the encoding's own, where it offers one for this context (``fused_attention``: fla's
  FoX, PaTH and stick-breaking kernels, posenc/nn/fla_kernels.py): given q and k transformed and
  scaled, it computes the whole layer (``FusedPlan``, ``attend_layer``). Where it cannot run, at its
  plan or when it runs (it raises ``KernelUnavailable``), the run's policy refuses it and the layer
  is computed from the hooks, as below (the plan those give is built when first needed). It computes no
  attention dropout (training with ``model.dropout > 0`` takes the hooks' path, said once) and runs
  outside a compiled graph (a graph break per layer: fla's PaTH op refuses compilation itself, and its
  Triton kernels are launched as they are); otherwise, from the hooks:
- nothing but causality: ``F.scaled_dot_product_attention(is_causal=True)`` (flash / cuDNN /
  memory-efficient), the fast common case; a logit scale multiplies q and keeps it;
- on CUDA, a bias offered as a score_mod, decays, a sink and/or a mask beyond causality:
  FlexAttention with the mask's ``BlockMask``, built once per forward and shared by every layer
  with that mask, so masked blocks are skipped (posenc/nn/flex.py);
- otherwise (CPU, or a CUDA fallback, said once per run in a warning): SDPA with an explicit mask,
  query-chunked at long T, with the weights written out where the encoding replaces softmax or q·k
  (posenc/nn/dense.py).

What the run may still take is the run's own ``KernelPolicy`` (posenc/nn/kernels.py), passed to
``plan``: which FlexAttention configuration a layer kind compiles with after failures, whether an
encoding's own kernel was refused. ``plans`` records in it, outside a compiled trace, which path
each layer kind took (``describe``).

Under document masking a bias that depends on positions only through i - j is computed at window
indices (``bias_context``): inside a document i - j is the difference of the indices and pairs across
documents are masked, so it is the same bias with no per-sequence gather.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn import dense, failures, flex, kernels, torch_private
from posenc.nn.context import Context, FusedAttention
from posenc.nn.dense import (  # noqa: F401 - the explicit-mask path's names, as attention's callers use them
    NO_TERMS,
    DensePlan,
    LayerTerms,
    explicit_weights,
    with_terms,
)
from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.failures import KernelUnavailable
from posenc.nn.flex import FlexPlan, FlexUnavailable
from posenc.nn.kernels import KernelPolicy, Running

#: FlexAttention's kernels need a head dimension of at least this
FLEX_MIN_HEAD_DIM = 16
#: the hooks whose terms are computed in each layer (a position bias is computed once per forward)
PER_LAYER = ("content_bias", "qk_scores", "decay", "sink_logit", "normalise")

__all__ = ["DensePlan", "FlexPlan", "FusedPlan", "Plan", "attend", "attend_layer", "describe", "plan", "plans",
           "select_kernel"]


def select_kernel(device_type: str, head_dim: int, dropout_p: float, offers_score_mod: bool,
                  replaces_softmax: bool = False, flex_available: bool = flex.AVAILABLE) -> tuple[str, str | None]:
    """The kernel for a bias or a mask beyond causality: ("flex" | "sdpa", why not flex on CUDA
    or None). FlexAttention is the CUDA path; on CPU it has no backward (torch 2.13), so SDPA
    with an explicit mask is the designed path there, not a fallback."""
    if device_type != "cuda":
        return "sdpa", None
    if not flex_available:
        return "sdpa", "FlexAttention is not available in this torch (upgrade torch to >= 2.5)"
    if head_dim < FLEX_MIN_HEAD_DIM:
        return "sdpa", (f"FlexAttention needs head_dim >= {FLEX_MIN_HEAD_DIM}, this model has {head_dim} "
                        f"(raise model.d_model / model.n_head)")
    if dropout_p > 0:
        return "sdpa", "FlexAttention has no attention dropout (model.dropout > 0)"
    if not offers_score_mod:
        return "sdpa", "the encoding offers no score_mod"
    if replaces_softmax:
        return "sdpa", "the encoding replaces softmax, which FlexAttention computes"
    return "flex", None


def encode(encoding: PositionalEncoding, q: Tensor, k: Tensor, ctx: Context, layer: int
           ) -> tuple[Tensor, Tensor, LayerTerms]:
    """What an encoding does to one layer's attention, in the contract's order: rotate q and k;
    the content bias from the rotated q, k; the logit scale τ on q (so it multiplies q·k/√d
    alone, on every kernel); scores replacing q·k from the rotated, scaled q and k; the decays,
    the sink and the normaliser. ctx carries the block's input x (``Context.with_input``).
    q, k: (B, H, T, hd) -> q, k (rotated, scaled), terms."""
    q, k = encoding.transform_qk(q, k, ctx, layer)
    content = encoding.content_bias(q, k, ctx, layer) if encoding.offers("content_bias") else None
    q = with_logit_scale(encoding, q, ctx, layer)
    return q, k, LayerTerms(
        content=content,
        scores=encoding.qk_scores(q, k, ctx, layer) if encoding.offers("qk_scores") else None,
        decay=encoding.decay(ctx, layer) if encoding.offers("decay") else None,
        sink=encoding.sink_logit(layer) if encoding.offers("sink_logit") else None,
        normalise=encoding.normalise if encoding.offers("normalise") else None,
    )


def with_logit_scale(encoding: PositionalEncoding, q: Tensor, ctx: Context, layer: int) -> Tensor:
    """q (B, H, T, hd) times the encoding's logit scale τ, so it multiplies q·k/√d alone, on every kernel."""
    scale = encoding.logit_scale(ctx, layer) if encoding.offers("logit_scale") else None
    return q if scale is None else q * scale.to(q.dtype)  # x (B|1, H|1, T, 1): query i's logits x τ_i


@dataclass
class FusedPlan:
    """One layer kind's attention in one forward by its encoding's own kernel (``op``: its name, for the
    run's record); ``fallback`` builds the plan from the encoding's hooks, for a kernel that cannot run
    after all, which ``policy`` then refuses for layer kind ``kind``."""

    kernel: FusedAttention
    name: str
    fallback: Callable[[], Plan]
    policy: KernelPolicy
    kind: str = kernels.DEFAULT_KIND
    op: str = "fused_attention"
    failed: bool = False
    _hooks: Plan = None

    @torch_private.disable_dynamo  # the kernel runs eagerly inside a compiled model (one graph break)
    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int) -> Tensor | None:
        """q, k (B, H, T, d) transformed and scaled, v (B, H, T, dv), ctx with the block's input ->
        (B, H, T, dv); None where the kernel cannot run (then, for this forward's other layers too)."""
        if self.failed:
            return None
        try:
            return self.kernel(q, k, v, ctx, layer, None)
        except KernelUnavailable as refusal:
            if not self.policy.recover(failures.classify(refusal), Running(fused=((self.kind, self.op),))):
                raise
            self.failed = True
            self.policy.ran.saw(self.kind, kernels.HOOKS)  # this forward; the next one plans (and records) the hooks
            return None

    def hooks_plan(self) -> Plan:
        """The plan from the encoding's hooks, built once."""
        if self._hooks is None:
            self._hooks = self.fallback()
        return self._hooks


#: how one layer's attention is computed in one forward: None is SDPA's is_causal fast path
Plan = DensePlan | FlexPlan | FusedPlan | None


def plan(encoding: PositionalEncoding, ctx: Context, layer: int, dropout_p: float, policy: KernelPolicy) -> Plan:
    """How block ``layer`` attends in this forward: by the encoding's own kernel where it offers one
    here, else as its hooks say (``hooks_plan``). policy: the run's (a model's forward passes its own)."""
    hooks = functools.partial(hooks_plan, encoding, ctx, layer, dropout_p, policy)
    own = fused_plan(encoding, ctx, layer, dropout_p, hooks, policy) if encoding.offers("fused_attention") else None
    return own or hooks()  # whether it offers one is decided while tracing: no graph break for the others


@torch_private.disable_dynamo  # imports, signatures and warnings: asked outside a compiled graph
def fused_plan(encoding: PositionalEncoding, ctx: Context, layer: int, dropout_p: float,
               fallback: Callable[[], Plan], policy: KernelPolicy) -> FusedPlan | None:
    """The encoding's own kernel for block ``layer`` in this forward, or None: it offers none here, the run
    refused it (it could not run), or attention dropout is asked (one warning). A kernel the encoding's hook
    says cannot run here (``KernelUnavailable``: its library missing, a dtype, head dim or window it does
    not take) is refused for the run, recorded and said once."""
    kind = policy.kind_of(layer, encoding.name)
    if policy.fused_is_refused(kind):
        return None
    try:
        kernel = encoding.fused_attention(ctx, layer)
    except KernelUnavailable as refusal:
        if not policy.recover(failures.classify(refusal), Running(fused=((kind, refusal.op),))):
            raise
        return None
    if kernel is None:
        return None
    if dropout_p > 0:
        policy.say(f"encoding '{encoding.name}': its fused kernel has no attention dropout (model.dropout > 0): "
                   f"attention computes it from the encoding's hooks")
        return None
    return FusedPlan(kernel, encoding.name, fallback, policy, kind, getattr(kernel, "op", "fused_attention"))


def hooks_plan(encoding: PositionalEncoding, ctx: Context, layer: int, dropout_p: float,
               policy: KernelPolicy) -> Plan:
    """How block ``layer`` attends from what its encoding's hooks offer, its mask and the device (one
    warning per run when a CUDA run falls back from FlexAttention)."""
    mask = ctx.mask(layer)
    per_layer = any(encoding.offers(hook) for hook in PER_LAYER)
    biased = encoding.offers("position_bias")
    if not biased and not per_layer and mask.causal_only:
        return None
    if encoding.offers("content_bias"):  # its (B, H, T, T) term joins the explicit mask, so the bias does too
        return dense_plan(encoding, ctx, layer)
    if encoding.offers("qk_scores"):  # no fused kernel computes another q·k: the logits are written out
        if ctx.device.type == "cuda":
            policy.say(f"encoding '{encoding.name}' replaces q·k: attention writes its logits out "
                       f"(O(H·T²) memory per layer, query-chunked at long T); no fused kernel runs here")
        return dense_plan(encoding, ctx, layer)
    replaces_softmax = encoding.offers("normalise")
    kernel, why_not = select_kernel(ctx.device.type, encoding.head_dim, dropout_p, True, replaces_softmax)
    if kernel == "flex":
        score_mod = encoding.score_mod(bias_context(encoding, ctx)) if biased else None
        if biased and score_mod is None:
            kernel, why_not = select_kernel(ctx.device.type, encoding.head_dim, dropout_p, False, replaces_softmax)
    if kernel == "flex":
        key = kernels.kernel_key(policy.kind_of(layer, encoding.name), encoding, encoding.head_dim, ctx.dtype)
        options = policy.flex_options(key)  # read in a compiled trace: dynamo guards on it
        if options == kernels.DENSE:  # no configuration compiled here: recorded and said when it failed
            return dense_plan(encoding, ctx, layer)
        return FlexPlan(score_mod, mask.block_mask(ctx.device), key=key, options=options,
                        dense=functools.partial(dense_plan, encoding, ctx, layer), policy=policy)
    if why_not is not None:  # a CUDA run that cannot take FlexAttention (on a CPU SDPA is the design)
        what = f"encoding '{encoding.name}'" if biased or per_layer else f"the {mask.window.describe()} mask"
        policy.say(f"{what}: attention falls back from FlexAttention to SDPA with an explicit mask "
                   f"(slower, O(H·T²) memory per layer) because {why_not}")
    return dense_plan(encoding, ctx, layer)


def dense_plan(encoding: PositionalEncoding, ctx: Context, layer: int) -> DensePlan:
    """The explicit-mask plan of block ``layer``: its mask and its encoding's position bias."""
    bias = encoding.position_bias if encoding.offers("position_bias") else None
    return DensePlan.build(ctx.mask(layer), bias, bias_context(encoding, ctx).pos, ctx.dtype, dense.DENSE_MAX_LEN)


def bias_context(encoding: PositionalEncoding, ctx: Context) -> Context:
    """The context a layer's position bias is computed in: window indices under documents packing for a
    relative bias (it offers ``distance_bias``: i - j inside a document is the difference of the indices,
    and pairs across documents are masked), else the positions themselves."""
    return ctx.at_indices() if ctx.doc is not None and encoding.offers("distance_bias") else ctx


def plans(encoding: PositionalEncoding, ctx: Context, n_layer: int, dropout_p: float, policy: KernelPolicy,
          layers: Iterable[int] | None = None) -> list[Plan]:
    """Every block's plan for one forward (None for the blocks not in ``layers``, when given: a
    recurrent or linear layer has no mask or scores); layers with the same encoding and mask share
    one (a position bias is computed once per forward and shared, as T5 does). Outside a compiled
    trace, each layer kind's path is recorded in the run's policy."""
    attending = set(range(n_layer) if layers is None else layers)
    shared: dict[tuple[int, int], Plan] = {}
    out: list[Plan] = []
    for layer in range(n_layer):
        if layer not in attending:
            out.append(None)
            continue
        layer_encoding = encoding.for_layer(layer)
        key = (id(layer_encoding), id(ctx.mask(layer)) if ctx.masks else -1)
        if key not in shared:
            shared[key] = plan(layer_encoding, ctx, layer, dropout_p, policy)
        out.append(shared[key])
    if not torch.compiler.is_compiling():  # in a trace the write would be lost with a failure: see GPT.planned
        for layer in sorted(attending):
            policy.ran.saw(policy.kind_of(layer, encoding.for_layer(layer).name), *describe(out[layer]))
    return out


def describe(plan: Plan) -> tuple[str, kernels.KernelOptions]:
    """A plan's path as the run's record names it (posenc/nn/kernels.py), and its FlexAttention options."""
    if isinstance(plan, FusedPlan):
        return describe(plan.hooks_plan()) if plan.failed else (f"fused:{plan.op}", None)
    if isinstance(plan, FlexPlan):
        return (kernels.DENSE_PATH, None) if plan.fallback is not None else (kernels.FLEX, plan.options)
    if isinstance(plan, DensePlan):
        return kernels.DENSE_PATH, None
    return kernels.SDPA_CAUSAL, None


def running(plans: Iterable[Plan], policy: KernelPolicy) -> Running:
    """What a forward with these plans runs that a failure may change (``KernelPolicy.decide``): its
    FlexAttention kernels still on their ladder, its own kernels not refused, and the recurrent kinds on
    fla's kernels (as the run's record has them)."""
    flex_keys = {p.key for p in plans if isinstance(p, FlexPlan) and p.key is not None and p.options != kernels.DENSE}
    fused = {(p.kind, p.op) for p in plans if isinstance(p, FusedPlan) and not p.failed}
    recurrent = {(k.mixer, path.split(":", 1)[1]) for k in policy.kinds.values()
                 if (path := policy.ran.paths.get(k.name, "")).startswith("fla:")}
    return Running(tuple(sorted(flex_keys)), tuple(sorted(fused)), tuple(sorted(recurrent)), policy.compiled)


def attend(q: Tensor, k: Tensor, v: Tensor, plan: Plan = None, dropout_p: float = 0.0,
           terms: LayerTerms = NO_TERMS, query_chunk: int | None = None) -> Tensor:
    """Attention of one layer. q, k: (B, H, T, E), v: (B, H, T, Ev) -> (B, H, T, Ev).

    plan: the layer's plan for this forward; terms: what its encoding adds in this layer; query_chunk:
    rows per chunk of the explicit-mask path (posenc/nn/dense.py). A fused plan is computed here from the
    hooks' terms, as the plan they give (``attend_layer`` runs its kernel)."""
    if isinstance(plan, FusedPlan):
        plan = plan.hooks_plan()
    if plan is None and terms.empty:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if isinstance(plan, FlexPlan):
        if plan.fallback is None:
            try:
                return plan.attend(q, k, v, terms.decay, terms.sink)
            except FlexUnavailable:  # no kernel configuration compiled (said in a warning): the dense path
                plan.policy.ran.saw(plan.key.kind, kernels.DENSE_PATH)  # this forward's layers
        plan = plan.dense_plan()
    return dense.attend(q, k, v, plan, terms, dropout_p, query_chunk)


def attend_layer(q: Tensor, k: Tensor, v: Tensor, encoding: PositionalEncoding, ctx: Context, layer: int,
                 plan: Plan = None, dropout_p: float = 0.0) -> Tensor:
    """One layer's attention from its projections: q, k, v (B, H, T, hd) -> (B, H, T, hd); ctx carries the
    block's input. A fused plan's kernel is given q and k transformed and scaled; where it cannot run, or
    the plan is another, the encoding's hooks (``encode``) and ``attend``."""
    if isinstance(plan, FusedPlan):
        qt, kt = encoding.transform_qk(q, k, ctx, layer)
        out = plan.attend(with_logit_scale(encoding, qt, ctx, layer), kt, v, ctx, layer)
        if out is not None:
            return out
    q, k, terms = encode(encoding, q, k, ctx, layer)
    return attend(q, k, v, plan, dropout_p, terms)
