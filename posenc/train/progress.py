"""Training progress for people: a live rich bar in a terminal, plain lines everywhere else.

In a terminal the bar shows step, train loss, the last val ppl, tokens/s and time left. Without
one (a log file, SLURM, CI) a bar cannot redraw, so each log interval prints one plain line
(step/max, tokens, train loss, lr, tokens/s, ETA) and each evaluation another (val loss, ppl,
bpb). The same lines go into train.log (the log files of Hydra's job logging) either way, so a
run's losses can be read back from its directory alone.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from datetime import timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from posenc.display.terminal import make_console

log = logging.getLogger("posenc.progress")


def step_line(step: int, max_steps: int, tokens: int, loss: float, lr: float, tokens_per_s: float,
              eta_s: float | None) -> str:
    """One log interval: 'step 10/300  tokens 40,960  train loss 3.2145  lr 2.00e-03  6,512 tok/s  ETA 0:01:02'."""
    eta = "-" if eta_s is None or not math.isfinite(eta_s) else str(timedelta(seconds=round(eta_s)))
    return (f"step {step}/{max_steps}  tokens {tokens:,}  train loss {loss:.4f}  lr {lr:.2e}  "
            f"{tokens_per_s:,.0f} tok/s  ETA {eta}")


def eval_line(step: int, max_steps: int, val: dict[str, float]) -> str:
    """One evaluation: 'eval at step 50/300  val loss 2.3456  val ppl 10.44  val bpb 3.3840'."""
    parts = [f"{name.replace('/', ' ')} {val[key]:{fmt}}" for key, name, fmt in
             (("val/loss", "val loss", ".4f"), ("val/ppl", "val ppl", ".2f"), ("val/bpb", "val bpb", ".4f"))
             if key in val]
    return f"eval at step {step}/{max_steps}  " + "  ".join(parts)


def to_log_files(line: str) -> None:
    """line into every log file of the root logger (train.log), not onto the console."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, line, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
            handler.handle(record)


class TrainProgress:
    """The bar (terminal) or plain lines (no terminal); lines go to train.log in both cases."""

    def __init__(self, total_steps: int, description: str = "train", enabled: bool = True,
                 console: Console | None = None) -> None:
        self.total, self.enabled = total_steps, enabled
        self.console = console or make_console()
        self.live = enabled and self.console.is_terminal
        self.start_time, self.start_step = time.time(), None
        self.progress = None
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("train loss {task.fields[loss]}  val ppl {task.fields[ppl]}  {task.fields[tps]} tok/s"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self.task = self.progress.add_task(description, total=total_steps, loss="-", ppl="-", tps="-")

    def __enter__(self) -> TrainProgress:
        self.start_time = time.time()
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _line(self, line: str) -> None:
        if not self.enabled:
            return
        to_log_files(line)
        if not self.live:
            print(line, file=sys.stdout, flush=True)

    def eta(self, step: int) -> float | None:
        """Seconds left at the average pace of this process's steps after its first (evaluations
        included); None until one such step is done."""
        if self.start_step is None or step <= self.start_step:
            return None
        return (time.time() - self.start_time) / (step - self.start_step) * (self.total - step)

    def advance(self, step: int) -> None:
        if self.start_step is None:
            # the pace counts from the end of this process's first step: a resumed run's earlier steps
            # are not its pace, and neither is its first step's warm-up (allocating, filling caches: a
            # minute on a loaded machine, which alone made a resumed run one step from a log line read
            # "ETA 2:24:11" a few minutes from done)
            self.start_step, self.start_time = step, time.time()
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def update(self, step: int, loss: float, ppl: float | None, tokens_per_s: float,
               tokens: int = 0, lr: float = math.nan) -> None:
        """At a log step: the bar's fields, or one plain line."""
        if self.progress is not None:
            self.progress.update(
                self.task, completed=step, loss=f"{loss:.3f}", ppl="-" if ppl is None else f"{ppl:.2f}",
                tps=f"{tokens_per_s:,.0f}",
            )
        self._line(step_line(step, self.total, tokens, loss, lr, tokens_per_s, self.eta(step)))

    def evaluated(self, step: int, val: dict[str, float]) -> None:
        """After an evaluation: one plain line (val loss, ppl, bpb)."""
        self._line(eval_line(step, self.total, val))
