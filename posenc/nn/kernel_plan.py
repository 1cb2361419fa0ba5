"""An encoding's own kernel as a layer's plan: the contract's ``fused_attention`` hook.

An encoding that overrides ``fused_attention`` may offer, for a forward's context, a kernel that
computes a layer's whole attention (flash-linear-attention's FoX, PaTH and stick-breaking kernels:
posenc/nn/encodings/fla_attention.py; a plug-in's the same way). Attention asks once per forward and
layer kind (``fused_plan``) and, where one is offered, hands it q and k after the encoding's
``transform_qk`` and logit scale, v, and the block's context; everything else the encoding does
(decays, PaTH's transforms, the normaliser) is the kernel's to compute. Where none is offered, or
one cannot run after all (``KernelUnavailable``, whose message is the run's one warning), the layer
is computed from the hooks, as before: the plan those give is built when first needed (``hooks_plan``).

A fused kernel computes no attention dropout (training with ``model.dropout > 0`` takes the hooks'
path, said once) and runs outside a compiled graph (a graph break per layer: fla's PaTH op refuses
compilation itself, and its Triton kernels are launched as they are).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn import failures, kernels, planning
from posenc.nn.encodings.base import (
    Context,
    FusedAttention,
    KernelUnavailable,
    PositionalEncoding,
)
from posenc.nn.kernels import KernelPolicy


@dataclass
class FusedPlan:
    """One layer kind's attention in one forward by its encoding's own kernel (``op``: its name, for the
    run's record); ``fallback`` builds the plan from the encoding's hooks (posenc/nn/attention.py), for a
    kernel that cannot run after all, which ``policy`` then records for layer kind ``kind``."""

    kernel: FusedAttention
    name: str
    fallback: Callable[[], object]
    failed: bool = False
    _hooks: object = None
    policy: KernelPolicy | None = None
    kind: str = kernels.DEFAULT_KIND
    op: str = "fused_attention"

    # the kernel runs eagerly inside a compiled model (one graph break): torch's lazy form of
    # torch.compiler.disable, which imports dynamo only when first called (as posenc/nn/mask.py)
    @torch._disable_dynamo
    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int) -> Tensor | None:
        """q, k (B, H, T, d) transformed and scaled, v (B, H, T, dv), ctx with the block's input ->
        (B, H, T, dv); None where the kernel cannot run (then, for this forward's other layers too)."""
        if self.failed:
            return None
        try:
            return self.kernel(q, k, v, ctx, layer, None)
        except KernelUnavailable as refusal:
            self.failed = True
            policy = self.policy or kernels.OUTSIDE
            reason = failures.first_line(refusal.__cause__ if refusal.__cause__ is not None else refusal)
            policy.refuse_fused(self.kind, self.op, reason, str(refusal))
            policy.saw(self.kind, "hooks")  # this forward; the next one plans (and records) the hooks' path
            return None

    def hooks_plan(self) -> object:
        """The plan from the encoding's hooks, built once."""
        if self._hooks is None:
            self._hooks = self.fallback()
        return self._hooks


def fused_plan(encoding: PositionalEncoding, ctx: Context, layer: int, dropout_p: float,
               fallback: Callable[[], object], policy: KernelPolicy | None = None) -> FusedPlan | None:
    """The encoding's own kernel for block ``layer`` in this forward, or None: it offers none here, the
    run refused it (it could not run), or attention dropout is asked (one warning)."""
    if not encoding.offers("fused_attention"):  # decided while tracing: no graph break for the others
        return None
    return offered_plan(encoding, ctx, layer, dropout_p, fallback, policy or kernels.OUTSIDE)


@torch._disable_dynamo  # imports, signatures and warnings: asked outside a compiled graph
def offered_plan(encoding: PositionalEncoding, ctx: Context, layer: int, dropout_p: float,
                 fallback: Callable[[], object], policy: KernelPolicy) -> FusedPlan | None:
    """``fused_plan`` for an encoding that overrides ``fused_attention``."""
    kind = policy.kind_of(layer, encoding.name)
    if policy.fused_is_refused(kind):
        return None
    with planning.planning(policy):  # what the hook says (fla absent, a window it does not take) is the run's
        kernel = encoding.fused_attention(ctx, layer)
    if kernel is None:
        return None
    if dropout_p > 0:
        policy.warn(f"encoding '{encoding.name}': its fused kernel has no attention dropout (model.dropout > 0): "
                    f"attention computes it from the encoding's hooks")
        return None
    return FusedPlan(kernel, encoding.name, fallback, policy=policy, kind=kind,
                     op=getattr(kernel, "op", "fused_attention"))

