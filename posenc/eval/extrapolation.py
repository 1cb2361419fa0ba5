"""Length extrapolation: perplexity at several multiples of the training length.

Press et al. (2022, "Train Short, Test Long", §4) evaluate a model trained on L tokens at
L' = L, 2L, ... with two protocols, both here:

- non-overlapping (default, ``eval.stride=null``): the span is cut into windows of L'
  tokens and every token is scored, so early tokens of each window see little context;
- sliding window (``eval.stride=S``): windows of L' tokens advance by S and only their last
  S tokens are scored (all of the first window's), so each scored token sees >= L'-S context.

Every length scores the same validation tokens: a fixed span of ``eval.tokens`` targets,
rounded to a multiple of the longest length, so 16L sees 16 times fewer windows than L over
the same text. A length the encoding cannot represent (learned beyond max_len) is reported
as not defined, with the reason, never clamped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from posenc.nn.encodings.base import PositionOutOfRange
from posenc.errors import UserError
from posenc.nn.model import GPT


@dataclass
class LengthResult:
    """Perplexity at one evaluation length; loss and ppl are None when not defined."""

    multiple: float
    length: int
    loss: float | None
    ppl: float | None
    scored_tokens: int
    windows: int
    seconds: float
    reason: str | None = None

    @property
    def metric(self) -> str:
        return f"extrapolation/ppl@{self.length}"


def eval_lengths(seq_len: int, multiples: list[float]) -> list[int]:
    """Evaluation lengths in tokens: round(multiple · seq_len), each >= 1."""
    lengths = []
    for m in multiples:
        if m <= 0:
            raise UserError(f"eval.lengths must be positive multiples of trainer.seq_len, got {m}")
        lengths.append(max(1, round(m * seq_len)))
    return lengths


def eval_span(n_tokens: int, lengths: list[int], budget: int) -> int:
    """Targets scored at every length: the budget rounded down to a multiple of the longest
    length (at least one window of it), and no more than the validation split holds."""
    longest = max(lengths)
    span = max(longest, budget // longest * longest)
    available = (n_tokens - 1) // longest * longest
    if available < longest:
        raise UserError(
            f"the validation split has {n_tokens} tokens, fewer than one window of {longest + 1} "
            f"— use shorter eval.lengths or a larger dataset"
        )
    return min(span, available)


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
        yield w[:, :-1], w[:, 1:], windows[i][1]
        i = j


@torch.no_grad()
def perplexity_at(
    model: GPT,
    tokens: np.ndarray,
    length: int,
    span: int,
    stride: int | None,
    batch_tokens: int,
    device: torch.device,
    autocast=nullcontext,
) -> tuple[float, int, int]:
    """Mean next-token loss (nats) over targets [0, span) read in windows of ``length``;
    returns (loss, scored tokens, windows)."""
    windows = sliding_windows(span, length, stride)
    batch = max(1, batch_tokens // length)
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for x, y, first in _batches(tokens, windows, length, batch):
        x, y = x.to(device), y.to(device)
        with autocast():
            logits, _ = model(x)  # (b, length, vocab)
        scored = logits[:, first:].float()
        total += F.cross_entropy(scored.reshape(-1, scored.shape[-1]), y[:, first:].reshape(-1), reduction="sum").double()
        count += y[:, first:].numel()
    return float(total) / count, count, len(windows)


def evaluate_extrapolation(
    model: GPT,
    tokens: np.ndarray,
    seq_len: int,
    multiples: list[float],
    budget: int,
    batch_tokens: int,
    device: torch.device,
    autocast=nullcontext,
    stride: int | None = None,
    on_result: Callable[[LengthResult], None] | None = None,
) -> list[LengthResult]:
    """Perplexity at each multiple of seq_len over the same validation span (see module doc)."""
    if stride is not None and stride <= 0:
        raise UserError(f"eval.stride must be a positive number of tokens or null, got {stride}")
    lengths = eval_lengths(seq_len, multiples)
    span = eval_span(len(tokens), lengths, budget)
    was_training = model.training
    model.eval()
    results = []
    try:
        for multiple, length in zip(multiples, lengths):
            started = time.time()
            result = LengthResult(multiple, length, None, None, 0, 0, 0.0)
            max_len = model.encoding.max_len
            if max_len is not None and length > max_len:
                result.reason = f"not defined: {model.encoding.name} has no positions beyond {max_len - 1}"
            else:
                try:
                    loss, result.scored_tokens, result.windows = perplexity_at(
                        model, tokens, length, span, stride, batch_tokens, device, autocast)
                    result.loss, result.ppl = loss, math.exp(min(loss, 700.0))
                except PositionOutOfRange as e:
                    result.reason = f"not defined: {e}"
            result.seconds = time.time() - started
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        model.train(was_training)
    return results


def metrics(results: list[LengthResult]) -> dict[str, float]:
    """The defined perplexities as ``extrapolation/ppl@<len>`` (for metrics.jsonl and W&B)."""
    return {r.metric: r.ppl for r in results if r.ppl is not None}


def summary(results: list[LengthResult], stride: int | None) -> dict:
    """For summary.json: every length's ppl (None if not defined) plus the full records."""
    return {
        **{r.metric: r.ppl for r in results},
        "extrapolation": {"stride": stride, "lengths": [asdict(r) for r in results]},
    }


def run_from_config(model: GPT, tokens: np.ndarray, cfg, device: torch.device, autocast=nullcontext,
                    on_result: Callable[[LengthResult], None] | None = None) -> list[LengthResult]:
    """evaluate_extrapolation with the settings of cfg.eval and cfg.trainer.seq_len."""
    e = cfg.eval
    return evaluate_extrapolation(
        model, tokens, cfg.trainer.seq_len, list(e.lengths), e.get("tokens", 16384), e.get("batch_tokens", 16384),
        device, autocast, stride=e.get("stride"), on_result=on_result,
    )
