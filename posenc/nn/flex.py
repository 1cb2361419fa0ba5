"""FlexAttention for position biases on CUDA (Dong et al., 2024, "Flex Attention").

An encoding's bias becomes a ``score_mod`` evaluated inside the fused kernel, so ALiBi's
-m_h·(i - j) or T5's bucket table is computed per score on the fly: no H x T x T tensor, on
the forward or the backward, and a learned table receives its gradient through the captured
tensor. A layer's decays (FoX) join the score_mod as c_i - c_j over the captured (B, H, T)
cumulative sums; a sink rescales the output with the log-sum-exp FlexAttention returns. The mask
is a ``BlockMask`` (posenc/nn/mask.py), which lets the kernel skip every block
above the diagonal, across documents or outside a window; without documents it depends only on
(T, window, device), so it is built once and cached.

FlexAttention has no backward on CPU (torch 2.13) and needs compilation to be fast, so
posenc.nn.attention takes this path on CUDA only. Its kernels are compiled on first use; a
configuration that fails to compile is replaced by a smaller one, and in the end by the dense
path, with one warning each: a failed kernel never ends a run. Which configuration a layer kind's
kernels take (the ladder) and what a failure changes are the run's policy's (posenc/nn/kernels.py):
inside a compiled model the failure reaches the train step (posenc/train/state.py), in an eager
forward (evaluation) the call itself is taken again through the policy's ``retry``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn import kernels
from posenc.nn.context import ScoreMod
from posenc.nn.kernels import DENSE, KernelKey, KernelOptions, KernelPolicy, Running

try:
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # torch < 2.5
    flex_attention = None
try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # torch < 2.9 returns the log-sum-exp with return_lse=True
    AuxRequest = None

#: whether this torch has FlexAttention
AVAILABLE = flex_attention is not None


def compiled_flex_attention():
    """flex_attention compiled (per compile backend, posenc/nn/kernels.py). Uncompiled it materialises
    the scores (slow, O(T²) memory), so the whole call must compile (fullgraph), and it is called within
    the run's ``KernelPolicy.compiling``, where reaching dynamo's recompile limit (one process building
    many score_mods) raises instead of running it uncompiled."""
    return _compiled_flex_attention(os.environ.get(kernels.BACKEND_VARIABLE, ""))


@functools.cache  # one torch.compile wrapper per backend: what it compiles is dynamo's, per process anyway
def _compiled_flex_attention(backend: str):
    return torch.compile(flex_attention, dynamic=False, fullgraph=True, backend=kernels.compile_backend())


class FlexUnavailable(RuntimeError):
    """Every kernel configuration of a layer kind failed to compile: attend through the dense path (no
    failure to recover from: the policy raises it)."""


@dataclass
class FlexPlan:
    """One layer kind's attention for one forward: the bias as a score_mod (None: no bias), the
    mask (causal, documents, window) as a BlockMask whose empty blocks the kernel skips, the
    kernel configuration to compile with (``key`` names the layer kind's kernels, ``options`` its
    rung of the ladder), the run's ``policy`` that answers a failed compilation (posenc/nn/kernels.py),
    and ``dense``, which builds the explicit-mask plan the layer kind falls back to when no
    configuration compiles."""

    score_mod: ScoreMod | None
    block_mask: object  # torch.nn.attention.flex_attention.BlockMask
    eager: bool = False  # FlexAttention's eager forward (`posenc check` on CPU, where it has no backward)
    key: KernelKey | None = None
    options: KernelOptions = None
    dense: Callable[[], object] | None = None  # () -> DensePlan (posenc/nn/attention.py)
    fallback: object | None = None  # the DensePlan, once this plan fell back to it
    policy: KernelPolicy | None = None

    def attend(self, q: Tensor, k: Tensor, v: Tensor, decay: Tensor | None = None,
               sink: Tensor | None = None) -> Tensor:
        """q, k: (B, H, T, E), v: (B, H, T, Ev) -> (B, H, T, Ev); decay: (B, H, T) cumulative
        log-decays of this layer; sink: (H,) its sink logits. Raises FlexUnavailable once no
        kernel configuration compiles (the caller then attends through ``self.dense_plan()``)."""
        if self.eager or torch.compiler.is_compiling():
            # inside a compiled model the outer compile fuses flex_attention (and a failure there
            # is the train step's to handle); `posenc check`'s CPU forward runs it eagerly
            return self.call(flex_attention, q, k, v, decay, sink)
        if self.key is None or self.policy is None:  # nothing to step down: a failure is raised
            return self.call(compiled_flex_attention(), q, k, v, decay, sink)
        policy, running = self.policy, Running(flex=(self.key,))

        def attempt() -> Tensor:
            self.options = policy.flex_options(self.key)  # the rung the last failure left it on
            if self.options == DENSE:
                raise FlexUnavailable(policy.flex_failure(self.key) or "FlexAttention did not compile")
            with policy.compiling():
                return self.call(compiled_flex_attention(), q, k, v, decay, sink)

        out = policy.retry(attempt, lambda failure: policy.decide(failure, running))
        policy.settled([self.key])
        return out

    def call(self, attend: Callable, q: Tensor, k: Tensor, v: Tensor, decay: Tensor | None,
             sink: Tensor | None) -> Tensor:
        """One FlexAttention call (compiled or not) with this plan's score_mod, decays, mask and options."""
        score_mod = with_decay(self.score_mod, decay)
        kwargs = {"score_mod": score_mod, "block_mask": self.block_mask}
        if self.options is not None:
            kwargs["kernel_options"] = self.options
        if sink is None:
            return attend(q, k, v, **kwargs)
        if AuxRequest is not None:
            out, aux = attend(q, k, v, **kwargs, return_aux=AuxRequest(lse=True))
            lse = aux.lse
        else:
            out, lse = attend(q, k, v, **kwargs, return_lse=True)
        # with the sink in the denominator every weight is softmax's × Σe^z / (Σe^z + e^s) = σ(lse - s)
        return out * torch.sigmoid(lse - sink[None, :, None].to(lse.dtype)).unsqueeze(-1).to(out.dtype)

    def dense_plan(self) -> object:
        """The explicit-mask plan this layer kind falls back to (built once)."""
        if self.fallback is None:
            if self.dense is None:
                raise RuntimeError("this FlexPlan has no dense fallback")
            self.fallback = self.dense()
        return self.fallback


def with_decay(score_mod: ScoreMod | None, c: Tensor | None) -> ScoreMod | None:
    """score_mod + c_i - c_j, looked up in the captured (B, H, T) cumulative log-decays c (their
    gradient flows through the capture, as a bias table's does). c is captured as two tensors, one
    for the queries' lookup and a copy for the keys': inductor's FlexAttention backward takes each
    captured tensor that needs a gradient indexed once (docs/extending.md); the copy is B·H·T."""
    if c is None:
        return score_mod
    c_q, c_k = c, c.clone()

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if score_mod is not None:
            score = score_mod(score, b, h, q_idx, kv_idx)
        return score + (c_q[b, h, q_idx] - c_k[b, h, kv_idx])

    return mod
