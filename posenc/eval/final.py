"""The end-of-training evaluation of a run, what it writes and what it shows in W&B.

- a corpus: perplexity at eval.lengths × the training length (posenc.eval.extrapolation);
- a synthetic task (dataset=synthetic): exact-match accuracy at dataset.eval_multiples × the
  training length (posenc.eval.tasks) instead, since perplexity over filler and random
  strings says nothing about whether the task is solved;
- either: the loss against the position in the window at those lengths
  (posenc.eval.per_position), written as ``per_position.json`` / ``.png`` in the run dir, unless
  ``eval.per_position=false`` (a second pass over the windows: as long as the first).

Each result goes to metrics.jsonl (history metrics at the last step) and to W&B as charts
(wandb.Table + line plot) and images; the returned dict is the summary.json part.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from posenc.eval import evaluation, per_position
from posenc.record.directory import write_json_atomic
from posenc.record.rundir import RunDir
from posenc.record.tracking import Tracker


def evaluate_run(model: nn.Module, data, cfg, run_dir: Path, tracker: Tracker, step: int, tokens: int,
                 device: torch.device, autocast=nullcontext) -> dict:
    """Everything evaluated at the end of training (see module doc); returns the summary part."""
    result = evaluation.evaluate(data, model, cfg, device, autocast)
    result.log_to(tracker, step, tokens)
    if tracker.enabled and cfg.eval.per_position:  # rank 0 alone writes the run's files
        record, figure = per_position_files(model, data, cfg, run_dir, device, autocast)
        per_position.log_to(tracker, record, figure, step, tokens)
    return result.summary


def per_position_files(model: nn.Module, data, cfg, out_dir: Path, device: torch.device, autocast=nullcontext,
                       stem: str = per_position.STEM, progress=None, kept: dict[int, dict] | None = None,
                       extra: dict | None = None, on_length: Callable[[], None] | None = None) -> tuple[dict, Path]:
    """The per-position record of a model, written as <stem>.json and <stem>.png in out_dir. With
    ``extra`` (`posenc eval`'s resume key) the JSON is written after each length too, and
    on_length() called: an interrupted evaluation keeps its finished lengths, and kept (those
    lengths, by length) are taken back instead of scored again."""
    batches = evaluation.evaluation_batches(data, cfg)

    def write_so_far(record: dict) -> None:
        write_json_atomic(out_dir / f"{stem}.json", {**record, **extra})
        if on_length is not None:
            on_length()

    record = per_position.per_position(model, batches, int(cfg.trainer.seq_len), device=device, autocast=autocast,
                                       progress=progress, kept=kept, on_length=write_so_far if extra else None)
    title = figure_title(model, record.get("stride"), out_dir)
    _, figure = per_position.write_per_position({**record, **(extra or {})}, out_dir, title, stem)
    return record, figure


def figure_title(model: nn.Module, stride: int | None, out_dir: Path) -> str:
    """'rope base=500 seed=1: per-position loss': the run among its sweep's, and the windows' stride."""
    stride = f", windows every {stride} tokens (eval.stride)" if stride else ""
    which = " ".join([model.encoding.name, *(v for v in RunDir(out_dir).varied() if not v.startswith("encoding="))])
    return f"{which}: per-position loss{stride}"
