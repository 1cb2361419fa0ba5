"""TrainState and train_step: one optimizer step, the same for `posenc train` and `posenc bench`.

The training loop (loop.py) and the benchmark (posenc.bench) both build a TrainState with
``new_train_state`` and advance it with ``train_step``, so the benchmark times exactly what
training runs: gradient accumulation, autocast, clipping, AdamW and the LR schedule.

AdamW with decoupled weight decay on matrices only (Loshchilov & Hutter, 2019), linear
warmup then cosine decay to ``min_lr_ratio · lr``, gradient clipping by global norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from posenc.data.batches import Batch
from posenc.hardware import use_compile
from posenc.nn import attention, failures
from posenc.nn.encodings.base import GROUP_DEFAULTS
from posenc.nn.failures import Failure
from posenc.nn.kernels import Action, Decision, KernelPolicy, Running, compile_backend
from posenc.train import distributed, recovery


class BatchSource(Protocol):
    """Where micro-batches come from: RandomWindows in training, a fixed batch in the bench."""

    def next(self) -> Batch: ...


def lr_lambda(warmup_steps: int, max_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """Multiplier of trainer.lr at a step: linear warmup, then cosine decay to min_lr_ratio."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def configure_optimizer(model: nn.Module, tcfg: DictConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the model's matrices only: not on biases and norms, and the
    positional encoding's parameters as its ``param_groups`` hook says — by default no decay at
    trainer.lr (T5's table, FIRE's MLP, CoPE's and learned positions' tables), so that no
    encoding's own parameters are pulled to zero while they learn. Groups: the decayed
    matrices, the rest without decay (the default encoding group joins it), then one group per
    other (lr_scale, weight_decay) an encoding asks for, each in the model's parameter order."""
    options = encoding_options(model)
    by_key: dict[object, list] = {"decay": [], "rest": []}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in options:
            key = "rest" if options[id(p)] == (1.0, 0.0) else options[id(p)]
        else:
            key = "decay" if p.dim() >= 2 and not n.startswith("encoding.") else "rest"
        by_key.setdefault(key, []).append(p)
    groups = [{"params": by_key.pop("decay"), "weight_decay": tcfg.weight_decay},
              {"params": by_key.pop("rest"), "weight_decay": 0.0}]
    groups += [{"params": params, "weight_decay": wd, "lr": tcfg.lr * scale} for (scale, wd), params in by_key.items()]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), fused=device.type == "cuda")


def encoding_options(model: nn.Module) -> dict[int, tuple[float, float]]:
    """id(parameter) -> (lr_scale, weight_decay) from the encoding's ``param_groups`` hook (a model
    without an encoding: none)."""

    encoding = getattr(model, "encoding", None)
    out: dict[int, tuple[float, float]] = {}
    for params, opts in encoding.param_groups() if encoding is not None else []:
        unknown = set(opts) - set(GROUP_DEFAULTS)
        if unknown:
            raise ValueError(f"{encoding.name}.param_groups(): unknown option(s) {sorted(unknown)} — "
                             f"use {', '.join(GROUP_DEFAULTS)}")
        scale, wd = float(opts.get("lr_scale", 1.0)), float(opts.get("weight_decay", 0.0))
        if scale <= 0 or wd < 0:
            raise ValueError(f"{encoding.name}.param_groups(): lr_scale must be > 0 and weight_decay >= 0, "
                             f"got {scale} and {wd}")
        out.update({id(p): (scale, wd) for p in params})
    return out


@dataclass
class TrainState:
    """Everything one optimizer step reads and changes."""

    model: nn.Module                 # the parameters: checkpoints and evaluation use this one
    eager_model: nn.Module           # what the step runs uncompiled: the model, DDP-wrapped under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    batches: BatchSource             # saved in checkpoints (its RNG), so a resume draws the same batches
    device: torch.device
    autocast: Callable               # zero-argument factory of the precision's autocast context
    grad_accum: int                  # micro-batches per optimizer step
    grad_clip: float                 # max global gradient norm
    step: int = 0                    # optimizer steps taken
    tokens: int = 0                  # training tokens seen, over all ranks
    kernels: KernelPolicy = field(default_factory=KernelPolicy)  # the run's kernels (the model's own)
    compiled_model: nn.Module | None = None  # torch.compile's wrapper around eager_model, where asked
    may_fail: bool = False           # whether a kernel can fail in a step: compiled, or on CUDA (fla's kernels)
    settled: int = -1                # the policy's changes when a step last settled (-1: none has)

    @property
    def step_model(self) -> nn.Module:
        """What the step runs: the compiled model while the run's policy runs it compiled."""
        return self.compiled_model if self.kernels.compiled and self.compiled_model is not None else self.eager_model

    @property
    def settling(self) -> bool:
        """Whether this step's kernels may compile or fail anew: the first step, and each after a change of
        what runs, where a kernel can fail at all. Such a step is taken in step with the other ranks under
        DDP (posenc/train/recovery.py), and the paths it took are recorded once it ran."""
        return self.may_fail and self.settled != self.kernels.changes


@dataclass
class StepResult:
    """What one step measured, as tensors on the device: reading them is a host sync, which
    the loop does at log steps only."""

    loss: Tensor                     # mean loss over the step's micro-batches (this rank's)
    grad_norm: Tensor                # global gradient norm before clipping
    lr: float                        # the learning rate the step used


def new_train_state(model: nn.Module, tcfg: DictConfig, batches: BatchSource, device: torch.device,
                    autocast: Callable) -> TrainState:
    """The optimizer, the LR schedule and the step model (DDP under torchrun, compiled when
    trainer.compile says so) for a model already on ``device``."""
    optimizer = configure_optimizer(model, tcfg, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(tcfg.warmup_steps, tcfg.max_steps, tcfg.min_lr_ratio))
    eager_model = distributed.wrap(model, device)
    kernels = getattr(model, "kernels", None) or KernelPolicy()  # the bench's plain reference has none
    kernels.ran.compile_asked = use_compile(tcfg.compile, device)
    compiled_model = None
    if kernels.ran.compile_asked:
        # each step runs within the run's KernelPolicy.compiling (dynamo's recompile limit raised for it, and
        # reaching it an error the policy answers: a sweep's jobs and a bench build many models in one
        # process). No torch._dynamo.reset() here or after a fallback: it would make the models still in use
        # (the bench's baselines) compile again inside their timed rounds
        compiled_model = torch.compile(eager_model, backend=compile_backend())
        kernels.compiled = True
    # a step settles where a kernel can fail in it: compiled, or on CUDA (fla's kernels); an eager CPU step
    # runs nothing that falls back, and keeps DDP's overlapped all-reduce
    return TrainState(model, eager_model, optimizer, scheduler, batches, device, autocast, int(tcfg.grad_accum),
                      float(tcfg.grad_clip), kernels=kernels, compiled_model=compiled_model,
                      may_fail=kernels.ran.compile_asked or device.type == "cuda")


def micro_batches(state: TrainState) -> Iterator[Batch]:
    """The next step's micro-batches from the state's source, drawn lazily (one at a time)."""
    return (state.batches.next() for _ in range(state.grad_accum))


def train_step(state: TrainState, batches: Iterable[Batch]) -> StepResult:
    """Exactly one optimizer step over ``state.grad_accum`` micro-batches: forward under
    autocast, backward of loss / grad_accum (the gradient of the mean; under DDP all-reduced on
    the last micro-batch only), clip, AdamW, LR schedule, zero the gradients. No host
    synchronisation inside.

    Kernels are compiled (or first run) inside a step, so a kernel that cannot be built here fails a
    step, in its forward or its backward: the step is taken again, from the same micro-batches and no
    gradient, after the run's policy decided what runs instead (posenc/nn/kernels.py: a FlexAttention
    kernel one rung down, an own or fla kernel refused, the model uncompiled, dynamo's recompile limit
    raised), recorded and said once; any other error ends the step as it would. What the failing
    forward ran is asked of the model outside any trace (``planned``: the same ``plans`` the compiled
    forward ran, on the same shapes), since a compiled forward's own record of what it planned is lost
    when it fails. Every fallback recorded while taking it is stamped with this step."""
    batches = list(batches)  # kept: a step whose kernels failed to compile is taken again
    policy, step, first = state.kernels, state.step + 1, len(state.kernels.fallbacks)
    try:
        result = policy.retry(lambda: attempt(state, batches), lambda failure: decided(state, failure, batches))
        if state.settling:
            settle(state, batches)
        return result
    finally:
        policy.stamp(first, step)


def attempt(state: TrainState, batches: list[Batch]) -> StepResult:
    """One attempt at the step; in step with the other ranks where it settles under DDP, where a failure
    is agreed on before it leaves (posenc/train/recovery.py)."""
    in_step = distributed.active() and state.settling
    tokens = state.tokens
    try:
        with state.kernels.compiling() if state.kernels.compiled else nullcontext():
            return take_step(state, batches, in_step)  # in step, it ends in ``agreed`` once its backward is done
    except Exception as error:
        state.optimizer.zero_grad(set_to_none=True)
        state.tokens = tokens
        if not in_step or isinstance(error, (recovery.Retake, recovery.PeerFailed)):
            raise
        merged = recovery.agree(state.kernels.decide(failures.classify(error), running(state, batches)))
        if merged.action is Action.RAISE:
            raise  # this rank's own error
        raise recovery.Retake(merged) from error


def decided(state: TrainState, failure: Failure, batches: list[Batch]) -> Decision:
    """What a failed attempt decided: what every rank agreed on (``Retake``), else the policy's decision,
    which outside a step taken in step no rank may take alone under DDP."""
    if isinstance(failure.error, recovery.Retake):
        return failure.error.decision
    if distributed.active():
        return Decision(Action.RAISE, failure.reason)
    return state.kernels.decide(failure, running(state, batches))


def planned(state: TrainState, batches: list[Batch]) -> list[attention.Plan]:
    """The plans of the step's forward on its first micro-batch, made outside any trace (GPT.planned, which
    records each layer kind's path); none for a model that plans nothing (the bench's plain reference)."""
    if not hasattr(state.model, "planned") or not batches:
        return []
    batch = batches[0].to(state.device)
    with state.autocast():
        return state.model.planned(batch.x, **batch.model_inputs())


def running(state: TrainState, batches: list[Batch]) -> Running:
    """What the step's forward ran that a failure may change (``attention.running``)."""
    return attention.running(planned(state, batches), state.kernels)


def settle(state: TrainState, batches: list[Batch]) -> None:
    """After the first step and every step retaken: the kernels that stepped down and compiled say where
    they ended, and each layer kind's path as the compiled forward took it is recorded."""
    state.kernels.settled(state.kernels.pending())
    planned(state, batches)
    state.settled = state.kernels.changes


def take_step(state: TrainState, batches: list[Batch], in_step: bool = False) -> StepResult:
    """The optimizer step of ``train_step``, once. in_step (DDP, a step that settles): every
    micro-batch's backward stays local, the ranks agree after each, and the gradients are averaged
    over ranks once every rank succeeded (posenc/train/recovery.py)."""
    loss_sum = torch.zeros((), device=state.device)
    seen = 0
    for batch in batches:
        batch = batch.to(state.device)
        seen += 1
        # under DDP the gradients are all-reduced once, in the last micro-batch's backward
        with distributed.no_sync(state.step_model, skip=in_step or seen < state.grad_accum):
            with state.autocast():
                _, loss = state.step_model(batch.x, batch.y, **batch.model_inputs())
            (loss / state.grad_accum).backward()
        if in_step:  # the ranks agree after each micro-batch: DDP's next forward syncs buffers, a collective
            recovery.agreed()
        loss_sum += loss.detach()
        state.tokens += batch.tokens * distributed.world_size()  # shapes only: no sync
        if seen == state.grad_accum:
            break
    if seen != state.grad_accum:
        raise ValueError(f"train_step needs {state.grad_accum} micro-batches (trainer.grad_accum), got {seen}")
    if in_step:
        recovery.average_gradients(state.model)  # every rank succeeded: the mean, as DDP's all-reduce leaves it
    grad_norm = torch.nn.utils.clip_grad_norm_(state.model.parameters(), state.grad_clip)
    lr = state.scheduler.get_last_lr()[0]
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return StepResult(loss_sum / state.grad_accum, grad_norm, lr)
