"""What a training step does when a kernel fails in it: decide what runs instead, agree on it
across ranks, record it, and take the step again.

Kernels are compiled (or first run) inside a step, so a kernel that cannot be built here fails a
step, in its forward or its backward. ``take`` runs the step through the one retry loop
(posenc/nn/failures.py); after each failure ``decide`` turns the classified error into a
``Decision`` and ``apply`` carries it out in the run's kernel policy (posenc/nn/kernels.py), which
records it (the layer kind, the paths, the reason, the step) and says it in one warning:

- dynamo's recompile limit reached: raised (a process setting, recorded as such);
- flash-linear-attention refused inside one of its kernels (its backward: the forward's refusals
  never leave the layer): the layer kinds that ran fla's kernels in the failing forward take their
  hooks (attention) or the chunked recurrence (a recurrent kind) for the rest of the run;
- a FlexAttention kernel failed to compile (its name is in the error): each layer kind whose plan in
  the failing forward was FlexAttention steps one rung down its ladder (posenc/nn/flex_kernels.py),
  to the dense path at the end. Which kinds those are is asked of the model outside any trace
  (``GPT.planned`` on the step's first micro-batch: the same ``plans`` the compiled forward ran, on
  the same shapes), since a compiled forward's own record of what it planned is lost when it fails;
  the rest of the model stays compiled;
- any other failed compilation of a compiled model (outside attention): the model runs uncompiled;
- anything else is raised: a bug, not a kernel to step around (``failures.classify``).

No ``torch._dynamo.reset()`` follows a step down: what ``plan()`` reads in the trace (the policy's
``revision``, then its ``flex_level``) is guarded by dynamo, so the failing model's graphs are traced again on its next call
with the new configuration, and only its; a reset would drop every compiled model of the process, the
bench's baselines among them, which would then compile again inside their timed rounds.

Under DDP every rank must take the same decision, or the ranks train different kernels, or one
rank waits in a collective the others never join. The attempts in which kernels compile (a run's
first step, and the step after each fallback) are therefore taken in step with the other ranks:
their micro-batches backward without DDP's all-reduce (``no_sync``), and after each micro-batch (DDP's
next forward broadcasts buffers, a collective a failed rank would not join) every rank hands its
decision (or "ok") to every other (``all_gather_object``), the decisions are merged the same way on
every rank (``merge``); only when every rank succeeded in every micro-batch are the gradients
averaged, by one all-reduce, before the optimizer's step. One rank's failure thus makes every rank retake the step
with the same choice. Other steps keep DDP's overlapped all-reduce and no collective of their own; a
failure in one of them under DDP is raised, since the other ranks may be waiting in DDP's all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from posenc.nn import failures
from posenc.nn.flex import FlexPlan
from posenc.nn.flex_kernels import DENSE, KernelKey
from posenc.nn.kernel_plan import FusedPlan
from posenc.train import distributed

if TYPE_CHECKING:
    from posenc.data.batches import Batch
    from posenc.train.state import StepResult, TrainState

#: a Decision's actions; RAISE ends the step with the error
RAISE, RETAKE = "raise", "retake"
Decision = dict  # {"action", "reason", "limit", "flex": [KernelKey], "fused": [(kind, op)], "recurrent": [(rule, op)], "uncompile"}


class Retake(RuntimeError):
    """Every rank agreed to take the step again as ``decision`` says (raised by an attempt in step)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision["reason"])
        self.decision = decision


class PeerFailed(RuntimeError):
    """Another rank's step failed with an error no rank can step around: this rank stops too."""


def take(state: TrainState, batches: list[Batch], step: Callable[[bool], StepResult]) -> StepResult:
    """``step(in_step)`` until it succeeds or fails with what ``decide`` raises (module doc). in_step:
    the attempt is taken in step with the other ranks (DDP's first step and the one after a fallback)."""
    policy = state.kernels
    policy.step = state.step + 1

    def attempt() -> StepResult:
        in_step = distributed.active() and policy.settling
        tokens = state.tokens
        try:
            return step(in_step)  # in step, it ends in ``agreed`` once its backward is done
        except Exception as error:
            state.optimizer.zero_grad(set_to_none=True)
            state.tokens = tokens
            if not in_step or isinstance(error, (Retake, PeerFailed)):
                raise
            merged = merge(agree(decide(state, failures.classify(error), batches)))  # joins the others' ``agreed``
            if merged["action"] == RAISE:
                raise  # this rank's own error
            raise Retake(merged) from error

    def recover(failure: failures.Failure) -> bool:
        if isinstance(failure.error, Retake):
            decision = failure.error.decision
        elif distributed.active():
            return False  # outside a step taken in step, no rank may decide alone (module doc)
        else:
            decision = decide(state, failure, batches)
        if decision["action"] == RAISE:
            return False
        apply(state, decision)
        policy.settling = True  # the next attempt compiles again: taken in step, and observed
        return True

    result = failures.retry(attempt, recover)
    if policy.settling:
        settled(state, batches)
    return result


def decide(state: TrainState, failure: failures.Failure, batches: list[Batch]) -> Decision:
    """What to run instead after ``failure`` in this step (module doc), or RAISE."""
    out: Decision = {"action": RETAKE, "reason": failure.reason, "limit": False, "flex": [], "fused": [],
                     "recurrent": [], "uncompile": False}
    if failure.kind == failures.RECOMPILE_LIMIT:
        return {**out, "limit": True}
    if failure.kind == failures.FLA_REFUSAL:
        plans = planned(state, batches)
        fused = sorted({(p.kind, p.op) for p in plans if isinstance(p, FusedPlan) and not p.failed})
        recurrent = sorted({(k.mixer, path.split(":", 1)[1]) for k in state.kernels.kinds.values()
                            if (path := state.kernels.paths.get(k.name, "")).startswith("fla:")})
        return {**out, "fused": fused, "recurrent": recurrent} if fused or recurrent else {**out, "action": RAISE}
    if failure.kind != failures.COMPILE:
        return {**out, "action": RAISE}
    compiled = hasattr(state.step_model, "_orig_mod")  # torch.compile's wrapper keeps the module here
    if failure.flex:
        keys = sorted({p.key for p in planned(state, batches)
                       if isinstance(p, FlexPlan) and p.key is not None and p.options != DENSE})
        if keys:
            return {**out, "flex": keys}
    return {**out, "uncompile": True} if compiled else {**out, "action": RAISE}


def merge(decisions: list[Decision]) -> Decision:
    """Every rank's decision as one, the same on every rank: RAISE if any rank raises, else every
    action any rank asked for ("ok" where every rank succeeded)."""
    failed = [d for d in decisions if d["action"] != "ok"]
    if not failed:
        return {"action": "ok"}
    raising = [d for d in failed if d["action"] == RAISE]
    if raising:
        return {"action": RAISE, "reason": raising[0]["reason"]}
    return {"action": RETAKE, "reason": failed[0]["reason"], "limit": any(d["limit"] for d in failed),
            "flex": sorted({KernelKey(*k) for d in failed for k in d["flex"]}),
            "fused": sorted({tuple(k) for d in failed for k in d["fused"]}),
            "recurrent": sorted({tuple(r) for d in failed for r in d["recurrent"]}),
            "uncompile": any(d["uncompile"] for d in failed)}


def agree(decision: Decision) -> list[Decision]:
    """Every rank's decision, in rank order, on every rank (this rank's alone without DDP)."""
    if not distributed.active():
        return [decision]
    everyone: list[Decision | None] = [None] * distributed.world_size()
    torch.distributed.all_gather_object(everyone, decision)
    return everyone  # type: ignore[return-value]


def apply(state: TrainState, decision: Decision) -> None:
    """Carry out a decision in the run's policy (recorded, said once) and the step model."""
    policy, device = state.kernels, state.device
    reason = decision["reason"]
    if decision["limit"]:
        policy.recompile_limit_raised(failures.raise_recompile_limit())
    for kind, op in decision["fused"]:
        policy.refuse_fused(kind, op, reason,
                            f"flash-linear-attention's {op} refused in a training step ({reason}): the {kind} layers "
                            f"compute from their encoding's hooks for the rest of this run, O(H·T²) memory per layer")
    for rule, op in decision["recurrent"]:
        policy.refuse_recurrent(rule, op, reason,
                                f"flash-linear-attention's {op} refused in a training step ({reason}): the {rule} layers "
                                f"use the chunked PyTorch recurrence for the rest of this run")
    for key in decision["flex"]:
        policy.flex_failed(KernelKey(*key), reason, device)
    if decision["uncompile"] and hasattr(state.step_model, "_orig_mod"):
        state.step_model = state.step_model._orig_mod
        policy.uncompiled(reason)


def planned(state: TrainState, batches: list[Batch]) -> list:
    """The plans of the step's forward on its first micro-batch, made outside any trace (GPT.planned);
    none for a model that plans nothing (the bench's plain reference)."""
    if not hasattr(state.model, "planned") or not batches:
        return []
    batch = batches[0].to(state.device)
    with state.autocast():
        return state.model.planned(batch.x, **batch.model_inputs())


def settled(state: TrainState, batches: list[Batch]) -> None:
    """After the first step and every step retaken: the kernels that stepped down and compiled say
    where they ended, and each layer kind's path as the compiled forward took it is recorded."""
    policy = state.kernels
    policy.flex_settled(list(policy.flex_pending), state.device)
    planned(state, batches)
    policy.settling = False


def agreed() -> None:
    """After each micro-batch of a step taken in step, its backward done on this rank: every rank says
    how it went; where one failed, the step is taken again as the failed ranks decided (``Retake``),
    or stopped (``PeerFailed``). A rank that failed answers from ``take``, once."""
    merged = merge(agree({"action": "ok"}))
    if merged["action"] == RAISE:
        raise PeerFailed(f"another rank's step failed: {merged['reason']}")
    if merged["action"] != "ok":
        raise Retake(merged)


def average_gradients(model: torch.nn.Module) -> None:
    """The mean of every gradient over ranks, as DDP's all-reduce leaves it, in one all-reduce (the
    gradients flattened into one buffer)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads or not distributed.active():
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat)
    flat /= distributed.world_size()
    for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)
