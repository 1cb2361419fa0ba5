"""Evaluation: mean loss over fixed, non-overlapping validation windows; ppl and bpb."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch

from posenc.data.batches import eval_windows, window_batches
from posenc.nn.model import GPT


@torch.no_grad()
def evaluate_loss(
    model: GPT,
    tokens: np.ndarray,
    length: int,
    max_windows: int | None,
    batch_size: int,
    device: torch.device,
    autocast=nullcontext,
) -> float:
    """Mean next-token cross-entropy (nats/token) over the first ``max_windows`` fixed
    windows of ``length`` targets; every run with the same data sees the same tokens."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device, dtype=torch.float64), 0
    starts = eval_windows(tokens, length, max_windows)
    if len(starts) == 0:
        raise ValueError(f"validation split is shorter than one window of {length + 1} tokens")
    for x, y in window_batches(tokens, starts, length, batch_size):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            _, loss = model(x, y)
        total += loss.double() * y.numel()
        count += y.numel()
    model.train(was_training)
    return float(total) / count


def loss_metrics(loss: float, bytes_per_token: float, prefix: str = "val") -> dict[str, float]:
    """loss (nats/token) -> {loss, ppl = e^loss, bpb = loss / ln 2 / bytes_per_token}."""
    return {
        f"{prefix}/loss": loss,
        f"{prefix}/ppl": math.exp(min(loss, 700.0)),
        f"{prefix}/bpb": loss / math.log(2) / bytes_per_token,
    }
