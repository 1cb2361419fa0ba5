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
from dataclasses import dataclass, field
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from posenc.data.batches import Batch
from posenc.hardware import use_compile
from posenc.nn import failures
from posenc.nn.encodings.base import GROUP_DEFAULTS
from posenc.nn.kernels import KernelPolicy
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
    step_model: nn.Module            # what the step runs: the model, DDP-wrapped and/or compiled
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
    step_model = distributed.wrap(model, device)
    kernels = getattr(model, "kernels", None) or KernelPolicy()  # the bench's plain reference has none
    kernels.compile_asked = use_compile(tcfg.compile, device)
    # the first step settles (posenc/train/recovery.py) where a kernel can fail in it: compiled, or on CUDA
    # (fla's kernels); an eager CPU step runs nothing that falls back, and keeps DDP's overlapped all-reduce
    kernels.settling = kernels.compile_asked or device.type == "cuda"
    if kernels.compile_asked:
        # a sweep's jobs (basic launcher) and a bench build many models in one process: past
        # dynamo's recompile limit later models would silently run eager, so posenc raises the
        # limit and makes reaching it an error train_step handles. No reset here (nor after a
        # fallback, posenc/train/recovery.py): it would make the models still in use (the bench's
        # baselines) compile again inside their timed rounds
        failures.loud_recompile_limit()
        step_model = torch.compile(step_model, backend=failures.compile_backend())
        kernels.compiled = True
    return TrainState(model, step_model, optimizer, scheduler, batches, device, autocast,
                      int(tcfg.grad_accum), float(tcfg.grad_clip), kernels=kernels)


def micro_batches(state: TrainState) -> Iterator[Batch]:
    """The next step's micro-batches from the state's source, drawn lazily (one at a time)."""
    return (state.batches.next() for _ in range(state.grad_accum))


def train_step(state: TrainState, batches: Iterable[Batch]) -> StepResult:
    """Exactly one optimizer step over ``state.grad_accum`` micro-batches: forward under
    autocast, backward of loss / grad_accum (the gradient of the mean; under DDP all-reduced on
    the last micro-batch only), clip, AdamW, LR schedule, zero the gradients. No host
    synchronisation inside.

    Kernels are compiled on a step's first run, so a kernel that fails to compile fails a step:
    the step is taken again, from the same micro-batches and no gradient, after the run's policy
    chose what runs instead, recorded and said once (posenc/train/recovery.py); any other error
    ends the step as it would."""
    batches = list(batches)  # kept: a step whose kernels failed to compile is taken again
    return recovery.take(state, batches, lambda in_step: take_step(state, batches, in_step))


def take_step(state: TrainState, batches: list[Batch], in_step: bool = False) -> StepResult:
    """The optimizer step of ``train_step``, once. in_step (DDP, a step that compiles): every
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
