"""The one evaluator: mean next-token loss over windows of fixed validation tokens.

Training's periodic ``val/*``, `posenc eval` and the extrapolation at every length all call
``score_windows``: targets ``[0, span)`` of the validation split, read in windows of
``length`` tokens, either

- non-overlapping (``stride=None``): windows start at 0, length, 2·length, ... and every
  target is scored (early targets of a window see little context), or
- sliding (``stride=S``, Press et al. 2022 §4): windows of ``length`` advance by S and only
  their last S targets are scored (all of the first window's), so each scored target sees
  at least length − S tokens of context.

Every target of the span is scored exactly once either way, so the same span gives the
same tokens whatever the length: that is what makes perplexities at different lengths, and
of different runs, comparable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc.errors import UserError
from posenc.metrics import VAL_BPB, VAL_LOSS, VAL_PPL


@dataclass(frozen=True)
class WindowLoss:
    """What score_windows measured: mean loss (nats/token) over scored_tokens targets."""

    loss: float
    scored_tokens: int
    windows: int
    bytes_per_token: float | None = None

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 700.0))  # e^loss; capped so a diverged model reads inf-free

    @property
    def bpb(self) -> float | None:
        """Bits per byte: loss / ln 2 / bytes per token (tokenizer-independent)."""
        return self.loss / math.log(2) / self.bytes_per_token if self.bytes_per_token else None

    def metrics(self) -> dict[str, float]:
        """As the validation metrics of a run: val/loss, val/ppl, val/bpb."""
        out = {VAL_LOSS.name: self.loss, VAL_PPL.name: self.ppl}
        if self.bpb is not None:
            out[VAL_BPB.name] = self.bpb
        return out


def fixed_span(n_tokens: int, length: int, windows: int | None = None) -> int:
    """Targets in the first ``windows`` non-overlapping windows of ``length`` that the split
    holds (each window reads length+1 tokens); every window if ``windows`` is None."""
    available = (n_tokens - 1) // length
    if available < 1:
        raise UserError(f"the validation split has {n_tokens} tokens, fewer than one window of {length + 1} "
                        f"— use a shorter length or a larger dataset")
    return (available if windows is None else min(windows, available)) * length


def sliding_windows(span: int, length: int, stride: int | None) -> list[tuple[int, int]]:
    """(start, first scored target offset in the window) for windows covering targets
    [0, span) exactly once. stride None: non-overlapping windows, all targets scored."""
    if stride is None or stride >= length:
        return [(s, 0) for s in range(0, span - length + 1, length)]
    windows = [(0, 0)]  # the first window scores everything
    end = length
    while end < span:
        step = min(stride, span - end)
        end += step
        windows.append((end - length, length - step))
    return windows


def _batches(tokens: np.ndarray, windows: list[tuple[int, int]], length: int, batch: int) -> Iterator:
    """Group windows by their scored offset (all equal but the first and the last) into batches."""
    i = 0
    while i < len(windows):
        j = i
        while j < len(windows) and j - i < batch and windows[j][1] == windows[i][1]:
            j += 1
        starts = [s for s, _ in windows[i:j]]
        w = torch.from_numpy(np.stack([tokens[s : s + length + 1] for s in starts]).astype(np.int64))
        yield w[:, :-1], w[:, 1:], windows[i][1]  # (b, length) inputs and targets
        i = j


@torch.no_grad()
def score_windows(
    model: nn.Module,
    tokens: np.ndarray,
    length: int,
    span: int,
    *,
    batch_size: int,
    device: torch.device,
    stride: int | None = None,
    autocast=nullcontext,
    bytes_per_token: float | None = None,
) -> WindowLoss:
    """Mean next-token cross-entropy over targets [0, span) of ``tokens``, read in windows of
    ``length`` (non-overlapping, or sliding by ``stride``), ``batch_size`` windows per forward.
    The model is evaluated in eval mode and handed back in the mode it came in."""
    if stride is not None and stride <= 0:
        raise UserError(f"eval.stride must be a positive number of tokens or null, got {stride}")
    windows = sliding_windows(span, length, stride)
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    try:
        for x, y, first in _batches(tokens, windows, length, max(1, batch_size)):
            x, y = x.to(device), y.to(device)
            with autocast():
                logits, _ = model(x)  # (b, length, vocab)
            scored = logits[:, first:].float()
            total += F.cross_entropy(scored.reshape(-1, scored.shape[-1]), y[:, first:].reshape(-1),
                                     reduction="sum").double()
            count += y[:, first:].numel()
    finally:
        model.train(was_training)
    return WindowLoss(float(total) / count, count, len(windows), bytes_per_token)
