"""Under DDP, every rank takes the same decision when a kernel fails in a training step.

A step whose kernel failed is taken again after the run's policy decided what runs instead
(``KernelPolicy.decide``, posenc/nn/kernels.py; the step: posenc/train/state.py). Under DDP every rank
must take the same decision, or the ranks train different kernels, or one rank waits in a collective
the others never join. The attempts in which kernels compile (a run's first step, and the step after
each change of what runs) are therefore taken in step with the other ranks: their micro-batches
backward without DDP's all-reduce (``no_sync``), and after each micro-batch every rank hands its
decision (``OK`` where it succeeded) to every other (``all_gather_object``, ``agree``), and the
decisions are merged the same way on every rank (``Decision.merged``); only when every rank succeeded
in every micro-batch are the gradients averaged, by one all-reduce, before the optimizer's step
(``average_gradients``). One rank's failure thus makes every rank retake the step with the same
decision (``Retake``), or stop (``PeerFailed``). Other steps keep DDP's overlapped all-reduce and no
collective of their own; a failure in one of them under DDP is raised, since the other ranks may be
waiting in DDP's all-reduce.
"""

from __future__ import annotations

import torch

from posenc.nn.kernels import Action, Decision
from posenc.train import distributed


class Retake(RuntimeError):
    """Every rank agreed to take the step again as ``decision`` says (raised by an attempt in step)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.reason)
        self.decision = decision


class PeerFailed(RuntimeError):
    """Another rank's step failed with an error no rank can step around: this rank stops too."""


def agree(decision: Decision) -> Decision:
    """Every rank's decision merged, the same on every rank (this rank's alone without DDP)."""
    if not distributed.active():
        return Decision.merged([decision])
    everyone: list[Decision | None] = [None] * distributed.world_size()
    torch.distributed.all_gather_object(everyone, decision)
    return Decision.merged(everyone)  # type: ignore[arg-type]


def agreed() -> None:
    """After each micro-batch of a step taken in step, its backward done on this rank: every rank says
    how it went; where one failed, the step is taken again as the failed ranks decided (``Retake``),
    or stopped (``PeerFailed``). A rank that failed answers from its failed attempt, once."""
    merged = agree(Decision(Action.OK))
    if merged.action is Action.RAISE:
        raise PeerFailed(f"another rank's step failed: {merged.reason}")
    if merged.action is not Action.OK:
        raise Retake(merged)


def average_gradients(model: torch.nn.Module) -> None:
    """The mean of every gradient over ranks, as DDP's all-reduce leaves it, in one all-reduce (the
    gradients joined into one buffer)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads or not distributed.active():
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= distributed.world_size()
    for g, synced in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(synced.view_as(g))
