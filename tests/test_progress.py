"""Progress a user can follow with or without a terminal, and the same lines in train.log."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from conftest import TINY, run_cli, run_dirs
from rich.console import Console

from posenc.record.metrics import convergence_metrics
from posenc.report.console import print_summary
from posenc.train.progress import TrainProgress, eval_line, step_line

STEP = re.compile(r"step (\d+)/4  tokens ([\d,]+)  train loss \d+\.\d{4}  lr \d\.\d\de[-+]\d\d  [\d,]+ tok/s  ETA \S+")
EVAL = re.compile(r"eval at step (\d+)/4  val loss \d+\.\d{4}  val ppl \d+\.\d\d  val bpb \d+\.\d{4}")


def test_without_a_terminal_each_log_step_and_evaluation_is_one_plain_line_also_in_train_log(workdir: Path):
    # run_cli's stdout is a pipe, as under SLURM, CI or `> log`
    # eval_interval=4 with 4 early evaluations per interval: every step of these 4 is evaluated
    result = run_cli("train", *TINY, "encoding.base=10000", "trainer.eval_interval=4", "trainer.early_evals=4",
                     cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    steps = [int(m.group(1)) for m in STEP.finditer(result.stdout)]
    evals = [int(m.group(1)) for m in EVAL.finditer(result.stdout)]
    assert steps == [1, 2, 3, 4] and evals == [1, 2, 3, 4]  # log_interval=1; the dense early schedule
    assert [int(m.group(2).replace(",", "")) for m in STEP.finditer(result.stdout)] == [128, 256, 384, 512]
    assert "train ━" not in result.stdout  # no bar frozen into the log
    [run_dir] = run_dirs(workdir)
    log = (run_dir / "train.log").read_text()
    assert len(STEP.findall(log)) == 4 and len(EVAL.findall(log)) == 4
    assert "rope  base=10000  " in result.stdout  # as typed, not 10000.0 or 1e4


def test_the_live_bar_labels_train_loss_and_val_ppl():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with TrainProgress(10, console=console) as progress:
        progress.advance(1)
        progress.update(1, 3.25, 25.5, 1000.0, tokens=64, lr=1e-3)
    text = out.getvalue()
    assert "train loss 3.250" in text and "val ppl 25.50" in text


def test_plain_lines_read_as_a_person_would_write_them():
    assert step_line(10, 300, 40960, 3.21449, 2e-3, 6512.4, 62) == \
        "step 10/300  tokens 40,960  train loss 3.2145  lr 2.00e-03  6,512 tok/s  ETA 0:01:02"
    assert step_line(1, 300, 4096, 3.0, 2e-3, 100.0, None).endswith("ETA -")
    assert eval_line(50, 300, {"val/loss": 2.3456, "val/ppl": 10.441, "val/bpb": 3.384}) == \
        "eval at step 50/300  val loss 2.3456  val ppl 10.44  val bpb 3.3840"


def test_the_summary_says_how_val_ppl_and_ppl_at_1x_differ(capsys):
    summary = {"val/loss": 2.0, "val/ppl": 7.389, "val/bpb": 2.88, "seq_len": 32, "encoding": {"name": "rope"},
               "extrapolation": {"lengths": [{"length": 32, "multiple": 1.0, "ppl": 7.1}]}}
    print_summary(summary, Path("run"))
    out = " ".join(capsys.readouterr().out.split())
    assert "val/*: the last in-training evaluation" in out and "seq_len=32, validation split" in out
    assert "ppl @ L: the extrapolation evaluator (eval.tokens" in out
    # where the two agree (the same validation tokens: 1e-7 apart) the table shows one number, and no note
    print_summary({**summary, "extrapolation": {"lengths": [{"length": 32, "multiple": 1.0, "ppl": 7.3890001}]}},
                  Path("run"))
    assert "other tokens than val/ppl" not in " ".join(capsys.readouterr().out.split())


def test_a_task_runs_summary_leads_with_accuracy_and_a_target_passed_before_the_first_eval_is_a_bound(capsys):
    """Issue 36: a flip-flop run's table had no accuracy, and 'tokens to val/loss x' said 6,656 for
    every target because all were below at the first evaluation (6,656 tokens)."""
    rows = [{"step": 13, "tokens": 6656, "val/loss": 0.9}, {"step": 26, "tokens": 13312, "val/loss": 0.4}]
    summary = {"val/loss": 0.4, "seq_len": 32, "encoding": {"name": "rope"},
               **convergence_metrics(rows, [1.0, 0.5]),
               "tasks": {"task": "flip_flop", "lengths": [
                   {"length": 32, "multiple": 1.0, "accuracy": 0.975, "low": 0.96, "high": 0.985, "n": 512},
                   {"length": 64, "multiple": 2.0, "accuracy": 0.5, "low": 0.46, "high": 0.54, "n": 512}]}}
    assert summary["convergence/before_first_eval_loss@1"] is True  # summary.json marks the bound
    assert summary["convergence/before_first_eval_loss@0.5"] is False  # crossed between evaluations
    print_summary(summary, Path("run"))
    lines = [line.strip("│┃ ") for line in capsys.readouterr().out.splitlines() if "│" in line or "┃" in line]
    assert lines[0].startswith("metric") and lines[1].startswith("flip_flop accuracy @ 32 (1×)") and "97.5% [96.0%, 98.5%], n=512" in lines[1]
    assert lines[2].startswith("flip_flop accuracy @ 64 (2×)")  # the headline first, then val/loss
    assert any("tokens to val/loss 1 " in line and "before the first evaluation (≤ 6,656)" in line for line in lines)
    crossed = next(line for line in lines if "tokens to val/loss 0.5" in line)
    assert "before" not in crossed and "11,9" in crossed  # interpolated: 6,656 + 0.8·6,656 = 11,981


def test_a_task_run_leaves_out_the_language_modelling_targets_it_was_not_given(capsys):
    """The default targets (val/loss 2.5 … 1.75 nats) are losses of the byte corpus: on a task's
    answer-only loss they cannot apply, and a task run's table leaves them out."""
    from posenc.record.metrics import DEFAULT_TARGETS

    rows = [{"step": 13, "tokens": 6656, "val/loss": 2.6}, {"step": 26, "tokens": 13312, "val/loss": 0.4}]
    task = {"task": "flip_flop", "lengths": [{"length": 32, "multiple": 1.0, "accuracy": 1.0, "low": 0.99,
                                              "high": 1.0, "n": 512}]}
    base = {"val/loss": 0.4, "seq_len": 32, "encoding": {"name": "rope"}, **convergence_metrics(rows, [*DEFAULT_TARGETS, 0.5])}
    print_summary({**base, "tasks": task}, Path("run"))
    lines = capsys.readouterr().out
    assert "tokens to val/loss 0.5" in lines and "tokens to val/loss 2" not in lines
    print_summary(base, Path("run"))  # a language-modelling run keeps them
    lines = capsys.readouterr().out
    assert all(f"tokens to val/loss {t:g} " in lines for t in DEFAULT_TARGETS)


def test_a_resumed_runs_eta_is_its_pace_after_its_first_step(monkeypatch):
    """Issue 53: resumed one step before a log line, a run's ETA was its first step's time (a minute of
    warm-up on a loaded machine) times the steps left: "2:24:11" a few minutes from done. The pace now
    counts from the end of the process's first step, over its own steps only."""
    import posenc.train.progress as progress_module

    clock = [1000.0]
    monkeypatch.setattr(progress_module.time, "time", lambda: clock[0])
    progress = TrainProgress(300, enabled=False)
    with progress:
        clock[0] += 60.0  # the first step after the resume: allocations, caches, a busy machine
        progress.advance(150)
        assert progress.eta(150) is None  # one step of this process: no pace yet
        for step in range(151, 161):
            clock[0] += 1.0
            progress.advance(step)
        assert progress.eta(160) == pytest.approx(140.0)  # 1 s a step, 140 steps left


def test_the_whole_evaluations_eta_weighs_each_length_by_what_it_computes():
    """One rate, measured on the first windows, predicts every stage: a window costs its length ×
    the FLOPs per token at that length, so 16×'s 4 windows of 512 tokens cost what they compute, not
    what 4 windows of 1× cost; a stage kept from an interrupted evaluation is not counted."""
    from posenc.eval.progress import Stage, StageLines

    out, now = io.StringIO(), [0.0]
    progress = StageLines(Console(file=out, width=200), every_s=30.0, clock=lambda: now[0], first_s=10.0)
    stages = [Stage("ppl", 32, 1, 64), Stage("ppl", 512, 16, 4), Stage("per-position loss", 32, 1, 64)]
    cost = {32: 1.0, 512: 2.0}  # FLOPs per token: the attention term doubles it at 16×
    progress.plan(stages, cost.__getitem__)
    progress.keep(stages[2].label, "done")  # 64 · 32 · 1 of the plan done already, in another process
    progress.begin(stages[0].label, 64)
    now[0] = 10.0
    progress.advance(16, 64)  # 16 windows of 32 tokens in 10 s: 51.2 cost a second
    # left: 48 windows of 1× (1,536) + 4 of 16× (4 · 512 · 2 = 4,096) = 5,632 at 51.2 a second: 110 s
    assert out.getvalue().splitlines()[-1].endswith("whole evaluation: ETA 0:01:50")
    assert progress.finished == [stages[2].label]
