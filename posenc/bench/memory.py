"""Memory of a training step, and a long forward pass: what `posenc bench` reports besides speed.

On CUDA the allocator's peak over one train_step is exact. On CPU there is no allocator to
ask, so the estimate is what a step must hold: parameters, gradients, optimizer state, and
the tensors autograd saves for the backward during one forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import PositionOutOfRange
from posenc.train.state import TrainState, micro_batches, train_step


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on CPU), so a clock reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state: what a step holds besides activations."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, Tensor))
    return 2 * params + state


def saved_activation_bytes(model: nn.Module, forward: Callable[[], None]) -> int:
    """Bytes autograd saves for the backward during one forward (distinct storages, not the
    parameters): on CPU, where there is no allocator to ask, the step's activation memory."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(storages.values())


def step_peak_bytes(state: TrainState) -> int:
    """Peak bytes of one training step of this model (measured alone on CUDA, estimated on CPU)."""
    device = state.device
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        train_step(state, micro_batches(state))
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base + resident_bytes(state.model, state.optimizer)

    batch = state.batches.next().to(device)

    def forward() -> None:
        with state.autocast():
            state.model(batch.x, batch.y, **batch.model_inputs())

    return resident_bytes(state.model, state.optimizer) + saved_activation_bytes(state.model, forward)


def long_eval(model: nn.Module, device: torch.device, autocast, vocab: int, length: int) -> dict:
    """Forward only, no grad, batch 1, at ``length`` tokens: does it fit, and in how long."""
    idx = torch.randint(vocab, (1, length), device=device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        with torch.no_grad(), autocast():
            model(idx)
        sync(device)
    except PositionOutOfRange:
        return {"length": length, "status": "beyond max_len"}
    except torch.OutOfMemoryError:
        return {"length": length, "status": "OOM"}
    out = {"length": length, "status": "ok", "seconds": time.perf_counter() - start}
    if device.type == "cuda":
        out["peak_mem_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return out
