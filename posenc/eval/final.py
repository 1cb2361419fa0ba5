"""The end-of-training evaluation of a run, what it writes and what it shows in W&B.

- a corpus: perplexity at eval.lengths × the training length (posenc.eval.extrapolation);
- a synthetic task (dataset=synthetic): exact-match accuracy at dataset.eval_multiples × the
  training length (posenc.eval.tasks) instead, since perplexity over filler and random
  strings says nothing about whether the task is solved;
- either: the loss against the position in the window at those lengths
  (posenc.eval.per_position), written as ``per_position.json`` / ``.png`` in the run dir.

Each result goes to metrics.jsonl (history metrics at the last step) and to W&B as charts
(wandb.Table + line plot) and images; the returned dict is the summary.json part.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from posenc.eval import evaluation, per_position
from posenc.record.rundir import RunDir
from posenc.record.tracking import Tracker


def evaluate_run(model: nn.Module, data, cfg, run_dir: Path, tracker: Tracker, step: int, tokens: int,
                 device: torch.device, autocast=nullcontext) -> dict:
    """Everything evaluated at the end of training (see module doc); returns the summary part."""
    result = evaluation.evaluate(data, model, cfg, device, autocast)
    result.log_to(tracker, step, tokens)
    if tracker.enabled:  # rank 0 alone writes the run's files
        record, figure = per_position_files(model, data, cfg, run_dir, device, autocast)
        per_position.log_to(tracker, record, figure, step, tokens)
    return result.summary


def per_position_files(model: nn.Module, data, cfg, out_dir: Path, device: torch.device, autocast=nullcontext,
                       stem: str = per_position.STEM, progress=None) -> tuple[dict, Path]:
    """The per-position record of a model, written as <stem>.json and <stem>.png in out_dir."""
    record = per_position.per_position(model, evaluation.evaluation_batches(data, cfg), int(cfg.trainer.seq_len),
                                       device=device, autocast=autocast, progress=progress)
    stride = f", windows every {record['stride']} tokens (eval.stride)" if record.get("stride") else ""
    # the run among its sweep's: 'rope base=500 seed=1: per-position loss'
    which = " ".join([model.encoding.name, *(v for v in RunDir(out_dir).varied() if not v.startswith("encoding="))])
    _, figure = per_position.write_per_position(record, out_dir, f"{which}: per-position loss{stride}", stem)
    return record, figure
