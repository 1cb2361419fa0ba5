"""Length extrapolation: perplexity at several multiples of the training length.

Press et al. (2022, "Train Short, Test Long", §4) evaluate a model trained on L tokens at
L' = L, 2L, ... with two protocols, both here:

- non-overlapping (default, ``eval.stride=null``): the span is cut into windows of L'
  tokens and every token is scored, so early tokens of each window see little context;
- sliding window (``eval.stride=S``): windows of L' tokens advance by S and only their last
  S tokens are scored (all of the first window's), so each scored token sees >= L'-S context.

Every length goes through the one evaluator (``posenc.eval.loss.score_windows``) and scores
the same validation tokens: a fixed span of ``eval.tokens`` targets,
rounded to a multiple of the longest length, so 16L sees 16 times fewer windows than L over
the same text. A length the encoding cannot represent (learned beyond max_len) is reported
as not defined, with the reason, never clamped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import torch

from posenc.data.windows import Windows
from posenc.display.terminal import make_console
from posenc.errors import UserError
from posenc.eval.loss import score_windows
from posenc.eval.progress import stage_label
from posenc.nn.encodings.base import PositionOutOfRange
from posenc.nn.model import GPT
from posenc.record.metrics import EXTRAPOLATION_PPL, EXTRAPOLATION_PPL_MULTIPLE


STAGE = "ppl"  # its progress lines: 'ppl at length 4,096 (16×): …'


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
        return EXTRAPOLATION_PPL.key(length=self.length)


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


def evaluate_extrapolation(
    model: GPT,
    tokens: Windows | np.ndarray,
    seq_len: int,
    multiples: list[float],
    budget: int,
    batch_tokens: int,
    device: torch.device,
    autocast=nullcontext,
    stride: int | None = None,
    on_result: Callable[[LengthResult], None] | None = None,
    progress=None,
    kept: dict[int, LengthResult] | None = None,
) -> list[LengthResult]:
    """Perplexity at each multiple of seq_len over the same validation span (see module doc),
    each through the one evaluator, score_windows; progress (posenc.eval.progress.StageLines)
    hears of each length and its batches. A length in kept (an interrupted evaluation's result,
    posenc/eval/partial.py) is taken as it is, not scored again; on_result hears of the others."""
    if stride is not None and stride <= 0:
        raise UserError(f"eval.stride must be a positive number of tokens or null, got {stride}")
    lengths = eval_lengths(seq_len, multiples)
    span = eval_span(len(tokens), lengths, budget)
    results = []
    for multiple, length in zip(multiples, lengths):
        label = stage_label(STAGE, length, multiple)
        if kept and length in kept:
            results.append(kept[length])
            if progress is not None:
                progress.keep(label, outcome(kept[length]))
            continue
        started = time.time()
        result = LengthResult(multiple, length, None, None, 0, 0, 0.0)
        if progress is not None:
            progress.begin(label)
        max_len = model.encoding.max_len
        if max_len is not None and length > max_len:
            result.reason = f"not defined: {model.encoding.name} has no positions beyond {max_len - 1}"
        else:
            try:
                scored = score_windows(model, tokens, length, span, batch_size=batch_tokens // length,
                                       device=device, stride=stride, autocast=autocast,
                                       on_batch=progress.advance if progress is not None else None)
                result.loss, result.ppl = scored.loss, scored.ppl
                result.scored_tokens, result.windows = scored.scored_tokens, scored.windows
            except PositionOutOfRange as e:
                result.reason = f"not defined: {e}"
        result.seconds = time.time() - started
        if progress is not None:
            progress.end(outcome(result))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def outcome(result: LengthResult) -> str:
    """A length's result in a progress line: 'ppl 3.490 over 64 windows', or why it has none."""
    return f"ppl {result.ppl:.3f} over {result.windows:,} windows" if result.ppl is not None else str(result.reason)


def metrics(results: list[LengthResult]) -> dict[str, float]:
    """The defined perplexities as ``extrapolation/ppl@<len>`` and ``extrapolation/ppl@<multiple>x``
    (for metrics.jsonl and W&B: the first names the tokens, the second is one key in runs of any
    training length)."""
    defined = [r for r in results if r.ppl is not None]
    return {**{r.metric: r.ppl for r in defined},
            **{EXTRAPOLATION_PPL_MULTIPLE.key(multiple=float(r.multiple)): r.ppl for r in defined}}


def summary(results: list[LengthResult], stride: int | None, packing: str = "concat") -> dict:
    """For summary.json: every length's ppl (None if not defined) plus the full records, and
    how the windows were cut (packing, stride)."""
    return {
        **{r.metric: r.ppl for r in results},
        "extrapolation": {"stride": stride, "packing": packing, "lengths": [asdict(r) for r in results]},
    }


def run_from_config(model: GPT, data, cfg, device: torch.device, autocast=nullcontext,
                    on_result: Callable[[LengthResult], None] | None = None, progress=None,
                    kept: dict[int, LengthResult] | None = None) -> list[LengthResult]:
    """evaluate_extrapolation of a corpus's validation split with the settings of cfg.eval
    (its windows cut as eval.packing says, by default as training's dataset.packing) and
    cfg.trainer.seq_len."""
    e = cfg.eval
    return evaluate_extrapolation(
        model, data.validation_windows(e.packing), cfg.trainer.seq_len, list(e.lengths),
        int(e.tokens), int(e.batch_tokens), device, autocast, stride=e.stride,
        on_result=on_result, progress=progress, kept=kept,
    )


def show(record: dict, results: list[LengthResult]) -> None:
    """The terminal table of `posenc eval` on a corpus: perplexity per length."""
    from rich.table import Table


    enc = record["encoding"]
    opts = ", ".join(f"{k}={v}" for k, v in enc.items() if k != "name")
    stride = record["extrapolation"]["stride"]
    title = (f"{enc['name']}" + (f" ({opts})" if opts else "") + f" — trained at {record['seq_len']} tokens, "
             + ("non-overlapping windows" if stride is None else f"sliding windows, stride {stride}"))
    table = Table(title=title, title_justify="left")
    for name in ("length", "× train", "ppl", "loss", "windows", "scored tokens", "time"):
        table.add_column(name, justify="right")
    table.add_column("note")
    for r in results:
        defined = r.ppl is not None
        table.add_row(f"{r.length:,}", f"{r.multiple:g}", f"{r.ppl:.3f}" if defined else "—",
                      f"{r.loss:.4f}" if defined else "—", f"{r.windows:,}", f"{r.scored_tokens:,}",
                      f"{r.seconds:.1f} s", r.reason or "")
    make_console().print(table)  # as wide as posenc's other output without a terminal
