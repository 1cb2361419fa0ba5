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

import logging
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from posenc.data.synthetic import SyntheticTask
from posenc.eval import extrapolation, per_position, tasks
from posenc.tracking import Tracker

log = logging.getLogger("posenc")


def evaluate_run(model: nn.Module, data, cfg, run_dir: Path, tracker: Tracker, step: int, tokens: int,
                 device: torch.device, autocast=nullcontext) -> dict:
    """Everything evaluated at the end of training (see module doc); returns the summary part."""
    out: dict = {}
    if isinstance(data, SyntheticTask):
        results = task_results(model, data, cfg, device)
        tasks.log_to(tracker, data.task, results, step, tokens)
        out.update(tasks.summary(data.task, results))
    else:
        lengths = extrapolation.run_from_config(model, data, cfg, device, autocast, on_result=_log_length)
        tracker.log(extrapolation.metrics(lengths), step=step, tokens=tokens)
        rows = [[r.length, r.multiple, r.ppl] for r in lengths if r.ppl is not None]
        tracker.log_curve("extrapolation/ppl_by_length", ["length", "multiple", "ppl"], rows, "length", "ppl",
                          step, tokens, title="perplexity against evaluation length")
        out.update(extrapolation.summary(lengths, cfg.eval.get("stride"), eval_packing(cfg)))
    if tracker.enabled:  # rank 0 alone writes the run's files
        record, figure = per_position_files(model, data, cfg, run_dir, device, autocast)
        per_position.log_to(tracker, record, figure, step, tokens)
    return out


def task_results(model: nn.Module, spec: SyntheticTask, cfg, device: torch.device) -> list[dict]:
    """Task accuracy at dataset.eval_multiples × trainer.seq_len on the same instances (seed 0)
    for every run of a comparison, whatever the run's own seed."""
    results = tasks.evaluate_task(model, spec, int(cfg.trainer.seq_len), seed=0,
                                  batch_tokens=int(cfg.eval.get("batch_tokens", 16384)), device=device)
    for r in results:
        log.info("task %s: length %d (%g×): %s", spec.task, r["length"], r["multiple"],
                 f"accuracy {r['accuracy']:.3f}" if r["accuracy"] is not None else r["skipped"])
    return results


def per_position_files(model: nn.Module, data, cfg, out_dir: Path, device: torch.device, autocast=nullcontext,
                       stem: str = per_position.STEM) -> tuple[dict, Path]:
    """The per-position record of a model, written as <stem>.json and <stem>.png in out_dir."""
    record = per_position.from_config(model, data, cfg, device, autocast)
    _, figure = per_position.write_per_position(record, out_dir, f"{model.encoding.name}: per-position loss", stem)
    return record, figure


def eval_packing(cfg) -> str:
    """How the evaluation windows are cut: eval.packing, by default as training's dataset.packing."""
    return cfg.eval.get("packing") or cfg.dataset.get("packing") or "concat"


def _log_length(r: extrapolation.LengthResult) -> None:
    log.info("extrapolation: length %d (%g×): %s", r.length, r.multiple, f"ppl {r.ppl:.3f}" if r.ppl else r.reason)
