"""The one evaluator: mean next-token loss over fixed held-out batches (``score_batches``).

Training's periodic ``val/*`` (``validator``: each data object provides its validation
batches, a corpus its first windows and a task its held-out instances), `posenc eval` and the
extrapolation at every length all score through it. On a corpus, ``score_windows`` reads
targets ``[0, span)`` of the validation split in windows of ``length`` tokens, cut as the
split's packing says (posenc/data/windows.py), either

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

import itertools
import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc.data.batches import IGNORE_INDEX, Batch
from posenc.data.windows import Packing, Windows, fixed_span, sliding_windows  # noqa: F401 - re-exported
from posenc.errors import UserError
from posenc.record.metrics import VAL_BPB, VAL_LOSS, VAL_PPL


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


def score_windows(
    model: nn.Module,
    tokens: Windows | np.ndarray,
    length: int,
    span: int,
    *,
    batch_size: int,
    device: torch.device,
    stride: int | None = None,
    autocast=nullcontext,
    bytes_per_token: float | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> WindowLoss:
    """Mean next-token cross-entropy over targets [0, span) of a split, read in windows of
    ``length`` (non-overlapping, or sliding by ``stride``; cut as the split's packing says),
    ``batch_size`` windows per forward. A bare token array is read as concat. on_batch(windows
    just scored, windows in all) after each forward, for progress."""
    if stride is not None and stride <= 0:
        raise UserError(f"eval.stride must be a positive number of tokens or null, got {stride}")
    windows = tokens if isinstance(tokens, Windows) else Windows(np.asarray(tokens), Packing.concat())
    starts = windows.starts(span, length, stride)
    return score_batches(model, windows.batches(starts, length, max(1, batch_size)), device, autocast,
                         bytes_per_token, windows=len(starts), on_batch=on_batch)


@torch.no_grad()
def score_batches(model: nn.Module, batches: Iterable[tuple[Batch, int]], device: torch.device,
                  autocast=nullcontext, bytes_per_token: float | None = None, windows: int | None = None,
                  on_batch: Callable[[int, int | None], None] | None = None,
                  reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> WindowLoss:
    """Mean cross-entropy over the scored targets of (batch, first scored position) pairs: every
    target from ``first`` on that is not IGNORE_INDEX (a task scores its answers only). The
    model is evaluated in eval mode and handed back in the mode it came in. ``reduce`` sums
    (summed loss, scored targets, windows) over the processes that each scored a share of the
    windows (training's validation under DDP), before the one division."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count, n = torch.zeros((), dtype=torch.int64, device=device), 0  # summed on the device: one sync at the end
    try:
        for batch, first in batches:
            batch = batch.to(device)
            with autocast():
                logits, _ = model(batch.x, **batch.model_inputs())  # (b, length, vocab)
            scored, y = logits[:, first:].float(), batch.y[:, first:]
            total += F.cross_entropy(scored.reshape(-1, scored.shape[-1]), y.reshape(-1), reduction="sum",
                                     ignore_index=IGNORE_INDEX).double()
            count += (y != IGNORE_INDEX).sum()
            n += y.shape[0]
            if on_batch is not None:
                on_batch(y.shape[0], windows)
    finally:
        model.train(was_training)
    # (3,) float64: token counts and windows are exact in a double far beyond any split's size
    sums = torch.stack([total, count.double(), torch.tensor(float(n), dtype=torch.float64, device=device)])
    if reduce is not None:
        sums = reduce(sums)
    total_loss, scored_tokens, n = float(sums[0]), int(sums[1]), int(sums[2])
    return WindowLoss(total_loss / max(scored_tokens, 1), scored_tokens, n if windows is None else windows,
                      bytes_per_token)


def global_batch(tcfg, world_size: int = 1) -> int:
    """Training windows per optimizer step: trainer.batch_size × trainer.grad_accum × processes."""
    return int(tcfg.batch_size) * int(tcfg.grad_accum) * int(world_size)


def validation_windows(tcfg, world_size: int = 1) -> int:
    """How many windows training's periodic validation scores: trainer.eval_batches × the global
    batch, so a run on N processes scores the windows one process scores at the same global batch."""
    return int(tcfg.eval_batches) * global_batch(tcfg, world_size)


def validator(model: nn.Module, data, tcfg, device: torch.device, autocast=nullcontext, rank: int = 0,
              world_size: int = 1, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Callable[[], dict]:
    """Training's periodic val/*: the same held-out windows at the training length at every
    evaluation and in every run (a corpus's first validation windows, a task's held-out
    instances, each data object providing its own), ``validation_windows`` of them. Under DDP the
    windows are cut into batches of trainer.batch_size, process ``rank`` scores every
    ``world_size``-th batch, and ``reduce`` (a sum over the processes) adds up their losses and
    token counts: val/loss is the mean over the same targets as one process's, whatever the
    number of processes."""
    bytes_per_token = data.bytes_per_token("validation")
    n = validation_windows(tcfg, world_size)

    def evaluate() -> dict[str, float]:
        batches = data.validation_batches(tcfg.seq_len, n, tcfg.batch_size)
        mine = itertools.islice(batches, rank, None, world_size)  # this process's share
        return score_batches(model, mine, device, autocast, bytes_per_token, reduce=reduce).metrics()

    return evaluate
