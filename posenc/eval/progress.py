"""Progress of an evaluation for people (`posenc eval`: each length, and within a long one its
batches of windows): plain lines in training's style (posenc/train/progress.py), one when a stage
starts, one at most every 30 s while it runs and one with its result."""

from __future__ import annotations

import time
from datetime import timedelta

from rich.console import Console

from posenc.display.terminal import make_console


def stage_line(label: str, done: int, total: int | None, elapsed_s: float, unit: str = "windows") -> str:
    """A long stage under way: 'ppl at 4,096 (16×): 12/64 windows  0:00:30 elapsed  ETA 0:02:10'."""
    eta = elapsed_s / done * (total - done) if total and done else None
    count = f"{done:,}/{total:,}" if total else f"{done:,}"
    left = "-" if eta is None else str(timedelta(seconds=round(eta)))
    return f"{label}: {count} {unit}  {timedelta(seconds=round(elapsed_s))} elapsed  ETA {left}"


class StageLines:
    """Progress of a wait without training steps (`posenc eval`: each length, and within a long
    one its batches of windows), as plain lines in training's style: one when a stage starts, one
    at most every `every_s` seconds while it runs (done/total, elapsed, ETA) and one with its
    result. Plain lines in a terminal too: a few per length, nothing to redraw, and a log read
    later shows where the time went."""

    def __init__(self, console: Console | None = None, every_s: float = 30.0, clock=time.monotonic) -> None:
        self.console = console or make_console()
        self.every_s, self.clock = every_s, clock
        self.label, self.done, self.total, self.started, self.last = "", 0, None, 0.0, 0.0

    def _print(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def begin(self, label: str, total: int | None = None) -> None:
        self.label, self.done, self.total = label, 0, total
        self.started = self.last = self.clock()
        self._print(f"{label}: started" + (f" ({total:,} windows)" if total else ""))

    def advance(self, n: int, total: int | None = None) -> None:
        """n more windows (or instances) done, of total where the caller knows it."""
        self.done += n
        self.total = total or self.total
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self._print(stage_line(self.label, self.done, self.total, now - self.started))

    def end(self, result: str) -> None:
        self._print(f"{self.label}: {result}  ({timedelta(seconds=round(self.clock() - self.started))})")
