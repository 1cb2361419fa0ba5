"""What evaluating a trained model means for its data, decided in one place.

A corpus (TokenData) is scored by perplexity at eval.lengths × the training length
(posenc.eval.extrapolation); a synthetic task (SyntheticTask, dataset=synthetic) by exact-match
accuracy at dataset.eval_multiples × the training length (posenc.eval.tasks), since perplexity
over filler and random strings says nothing about whether the task is solved. Training's end,
`posenc eval`, the per-position loss and the probes ask the functions below, which dispatch on the
data's type (functools.singledispatch), instead of testing the type themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import singledispatch

import numpy as np
import torch
from torch import nn

from posenc.data.batches import Batch
from posenc.data.packing import TokenData
from posenc.data.synthetic import SyntheticTask, make_task
from posenc.errors import UserError
from posenc.eval import extrapolation, per_position, tasks
from posenc.eval.per_position import Batches, corpus_batches, task_batches
from posenc.eval.progress import Stage

log = logging.getLogger("posenc")


@dataclass
class Evaluation:
    """One evaluation's results: ``summary`` for summary.json / eval.json, and how to log and
    show them (a W&B chart, a rich table)."""

    summary: dict
    log_to: Callable[..., None] = field(repr=False)       # (tracker, step, tokens)
    show: Callable[[dict], None] = field(repr=False)      # (record) -> prints a table


def eval_packing(cfg) -> str:
    """How the evaluation windows are cut: eval.packing, by default as training's dataset.packing."""
    return cfg.eval.packing or cfg.dataset.get("packing") or "concat"


@singledispatch
def evaluate(data, model: nn.Module, cfg, device: torch.device, autocast=nullcontext,
             on_result: Callable[[object], None] | None = None, progress=None, kept: dict | None = None) -> Evaluation:
    """Evaluate ``model`` on ``data`` as cfg says; ``on_result`` is called after each length, and
    progress (posenc.eval.progress.StageLines) hears of each length as it runs. kept: results of
    an interrupted evaluation by length (kept_results), taken as they are instead of run again."""
    raise TypeError(f"no evaluation for {type(data).__name__}")


@evaluate.register
def _(data: TokenData, model: nn.Module, cfg, device: torch.device, autocast=nullcontext,
      on_result=None, progress=None, kept=None) -> Evaluation:
    def each(r: extrapolation.LengthResult) -> None:
        log.info("extrapolation: length %d (%g×): %s", r.length, r.multiple, f"ppl {r.ppl:.3f}" if r.ppl else r.reason)
        if on_result is not None:
            on_result(r)

    results = extrapolation.run_from_config(model, data, cfg, device, autocast, on_result=each, progress=progress,
                                            kept=kept)

    def log_to(tracker, step: int, tokens: int) -> None:
        tracker.log(extrapolation.metrics(results), step=step, tokens=tokens)
        rows = [[r.length, r.multiple, r.ppl] for r in results if r.ppl is not None]
        tracker.log_curve("extrapolation/ppl_by_length", ["length", "multiple", "ppl"], rows, "length", "ppl",
                          step, tokens, title="perplexity against evaluation length")

    summary = summarise(data, cfg, results)
    asked, scored = summary["extrapolation"]["tokens_asked"], min(
        (r.scored_tokens for r in results if r.ppl is not None), default=summary["extrapolation"]["tokens_asked"])
    if scored < asked:  # the validation split (or a whole number of the longest windows) holds fewer
        log.warning("eval.tokens=%d asked, %d scored at each length: the validation split holds no more in whole "
                    "windows of the longest length — shorter eval.lengths or a larger dataset score more",
                    asked, scored)
    return Evaluation(summary, log_to, lambda record: extrapolation.show(record, results))


@evaluate.register
def _(data: SyntheticTask, model: nn.Module, cfg, device: torch.device, autocast=nullcontext,
      on_result=None, progress=None, kept=None) -> Evaluation:
    def each(r: dict) -> None:
        log.info("task %s: length %d (%g×): %s", data.task, r["length"], r["multiple"],
                 f"accuracy {r['accuracy']:.3f}" if r["accuracy"] is not None else r["skipped"])
        if on_result is not None:
            on_result(r)

    # the same instances (seed 0) for every run of a comparison, whatever the run's own seed
    results = tasks.evaluate_task(model, data, int(cfg.trainer.seq_len), seed=0,
                                  batch_tokens=int(cfg.eval.batch_tokens), device=device, progress=progress,
                                  kept=kept, on_result=each)
    return Evaluation(summarise(data, cfg, results),
                      lambda tracker, step, tokens: tasks.log_to(tracker, data.task, results, step, tokens),
                      lambda record: tasks.show(record, data.task, results))


@singledispatch
def summarise(data, cfg, results: list) -> dict:
    """The summary.json / eval.json part of an evaluation's results (those of some lengths, while
    it runs): a corpus's perplexities and how its windows were cut, or a task's accuracies."""
    raise TypeError(f"no evaluation for {type(data).__name__}")


@summarise.register
def _(data: TokenData, cfg, results: list) -> dict:
    summary = extrapolation.summary(results, cfg.eval.stride, eval_packing(cfg))
    summary["extrapolation"]["tokens_asked"] = int(cfg.eval.tokens)
    return summary


@summarise.register
def _(data: SyntheticTask, cfg, results: list) -> dict:
    return tasks.summary(data.task, results)


@singledispatch
def kept_results(data, summary: dict) -> dict:
    """The results by length in an evaluation's summary (summarise's), as evaluate takes them back."""
    raise TypeError(f"no evaluation for {type(data).__name__}")


@kept_results.register
def _(data: TokenData, summary: dict) -> dict:
    return {r["length"]: extrapolation.LengthResult(**r) for r in (summary.get("extrapolation") or {}).get("lengths", [])}


@kept_results.register
def _(data: SyntheticTask, summary: dict) -> dict:
    return {r["length"]: r for r in (summary.get("tasks") or {}).get("lengths", [])}


@singledispatch
def stages(data, cfg) -> list[Stage]:
    """What evaluating ``data`` will run, in order, for the whole evaluation's ETA: the perplexity
    (or a task's accuracy) at each length, then the per-position loss at each where
    eval.per_position asks for it."""
    raise TypeError(f"no evaluation for {type(data).__name__}")


@stages.register
def _(data: TokenData, cfg) -> list[Stage]:
    T, e = int(cfg.trainer.seq_len), cfg.eval
    lengths = extrapolation.eval_lengths(T, list(e.lengths))
    span = extrapolation.eval_span(len(data.validation), lengths, int(e.tokens))
    windows = data.validation_windows(e.packing)
    planned = [Stage(extrapolation.STAGE, L, m, len(windows.starts(span, L, e.stride)))
               for m, L in zip(e.lengths, lengths)]
    if e.per_position:
        planned += [Stage(per_position.STAGE, L, L / T, batches.windows)
                    for L, batches in evaluation_batches(data, cfg).items()]
    return planned


@stages.register
def _(data: SyntheticTask, cfg) -> list[Stage]:
    T = int(cfg.trainer.seq_len)
    lengths = tasks.task_lengths(T, data.eval_multiples)
    planned = [Stage(f"{data.task} accuracy", L, m, data.eval_instances) for m, L in zip(data.eval_multiples, lengths)]
    if cfg.eval.per_position:
        planned += [Stage(per_position.STAGE, L, L / T, data.eval_instances) for L in lengths]
    return planned


@singledispatch
def evaluation_batches(data, cfg) -> dict[int, Iterable[Batch]]:
    """The batches the per-position loss scores, by length: a corpus's fixed validation span in
    windows of eval.lengths × T (as eval.packing says) starting every eval.stride tokens
    (non-overlapping without one), or a task's evaluation instances (seed 0) at
    dataset.eval_multiples × T."""
    raise TypeError(f"no evaluation batches for {type(data).__name__}")


@evaluation_batches.register
def _(data: TokenData, cfg) -> dict[int, Iterable[Batch]]:

    T, batch_tokens = int(cfg.trainer.seq_len), int(cfg.eval.batch_tokens)
    lengths = extrapolation.eval_lengths(T, list(cfg.eval.lengths))
    span = extrapolation.eval_span(len(data.validation), lengths, int(cfg.eval.tokens))
    windows = data.validation_windows(cfg.eval.packing)
    return {L: corpus_batches(windows, L, span, batch_tokens, cfg.eval.stride) for L in lengths}


@evaluation_batches.register
def _(data: SyntheticTask, cfg) -> dict[int, Iterable[Batch]]:

    T, batch_tokens = int(cfg.trainer.seq_len), int(cfg.eval.batch_tokens)
    return {L: Batches(task_batches(data, L, 0, batch_tokens), data.eval_instances)
            for L in tasks.task_lengths(T, data.eval_multiples)}


@singledispatch
def probe_windows(data, length: int, windows: int) -> torch.Tensor:
    """(windows, length) token ids to probe: the first validation windows of a corpus, or a task's
    first evaluation instances; the same for every run, so runs compare."""
    raise TypeError(f"no probe windows for {type(data).__name__}")


@probe_windows.register
def _(data: TokenData, length: int, windows: int) -> torch.Tensor:
    if len(data.validation) < windows * length:
        raise UserError(f"the validation split has {len(data.validation)} tokens, fewer than {windows} windows "
                        f"of {length} — probe shorter lengths")
    w = np.asarray(data.validation[: windows * length], dtype=np.int64).reshape(windows, length)
    return torch.from_numpy(w)


@probe_windows.register
def _(data: SyntheticTask, length: int, windows: int) -> torch.Tensor:
    ids = make_task(data.task, length, windows, 0, **data.options)["ids"]
    return torch.tensor(ids, dtype=torch.int64)[:, :-1]
