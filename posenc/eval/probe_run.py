"""`posenc probe RUN_DIR [overrides…]`: attention probes of a trained run (posenc.eval.probes).

Reads the run's checkpoint and config as `posenc eval` does, runs one forward over the first
validation windows at ``lengths`` × the training length (the same tokens for every run, so runs
compare), and writes ``probes/probes.json`` and its PNG figures into the run directory: attention
entropy per layer and head against query position and context length, mean attention distance
per head, RoPE's per-frequency q/k norms (Barbero et al., 2025), and position biases b_h(n).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig

from posenc.build import encoding_summary
from posenc.eval.evaluation import probe_windows
from posenc.eval.probes import probe_lengths, write_probes
from posenc.eval.proof import RECORD_KEY
from posenc.eval.run import load_trained
from posenc.record.directory import plain_numbers
from posenc.record.rundir import RunDir
from posenc.record.tracking import Tracker

#: evaluation-length multiples probed by default
MULTIPLES = (1, 2, 4)


def probe_run(run_dir: Path, overrides: list[str], multiples=MULTIPLES, windows: int = 2,
              verdict_of: Callable[[DictConfig], dict | None] | None = None) -> list[Path]:
    """Probe run_dir's model at multiples × its training length; returns the files written.
    A run on a synthetic task is probed on its task's evaluation instances; a run logged to
    W&B gets the figures as images in its W&B run (resumed by id). verdict_of: the CLI's lookup
    of `posenc check`'s verdict (posenc/check/verdict.py), which warns where the encoding fails."""
    run = RunDir(run_dir)
    cfg, data, model, state, _, proved = load_trained(run, overrides, command="probe")
    if verdict_of is not None:
        verdict_of(cfg)
    device = next(model.parameters()).device
    T = int(cfg.trainer.seq_len)
    idx = {}
    for m in multiples:
        length = m * T
        if model.encoding.max_len is not None and length > model.encoding.max_len:
            continue  # a learned table has no positions there: nothing to probe
        idx[length] = probe_windows(data, length, windows).to(device)
    with torch.no_grad():
        probes = probe_lengths(model, idx)
    title = f"{run.path.name} · {encoding_title(model.encoding)}"
    paths = write_probes(probes, run.probes_dir, T, title, about={RECORD_KEY: proved})
    _log_to_wandb(run, cfg, state, [p for p in paths if p.suffix == ".png"])
    return paths


def encoding_title(encoding, width: int = 70) -> str:
    """'rope base=10000 fraction=1 style=interleaved …': the encoding's name and options, cut to width."""
    summary = plain_numbers(encoding_summary(encoding))  # base=10000, not 10000.0
    text = " ".join([summary.pop("name"), *(f"{k}={v}" for k, v in summary.items() if v is not None)])
    return text if len(text) <= width else text[: width - 1] + "…"


def _log_to_wandb(run: RunDir, cfg, state: dict, figures: list[Path]) -> None:
    """The probe figures as images in the run's W&B run (resumed by its id), when it has one."""
    if cfg.logger.name != "wandb" or cfg.logger.mode == "disabled" or not state.get("wandb_id"):
        return
    lc = cfg.logger
    tracker = Tracker(run.path)
    try:
        tracker.start_wandb(config={}, project=lc.project, mode=lc.mode, group=lc.group,
                            job_type="probe", name=run.path.name, run_id=state["wandb_id"], entity=lc.entity)
        # W&B keys as the files lie under the run dir: probes/<figure>
        names = {str(p.relative_to(run.path).with_suffix("")): p for p in figures}
        tracker.log_images(names, step=None, tokens=int(state.get("tokens") or 0))
    finally:
        tracker.finish()
