"""Progress of an evaluation for people (`posenc eval`: each length, and within a long one its
batches of windows): plain lines in training's style (posenc/train/progress.py), one when a stage
starts, one at most every 30 s while it runs and one with its result, and an ETA for the whole
evaluation, every length and pass, from the windows measured so far.

The whole evaluation's ETA weighs each stage by what it computes: its windows × their length × the
model's FLOPs per token at that length (``GPT.flops_per_token``: the attention term grows with the
length), so one rate measured on the first windows of 1× predicts the 16× stages too, which score
as many tokens but cost more per token. A stage kept from an interrupted evaluation
(posenc/eval/partial.py) is said and not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rich.console import Console

from posenc.display.terminal import make_console


def stage_label(kind: str, length: int, multiple: float) -> str:
    """A stage's name, the same in its progress lines and the evaluation's plan:
    'ppl at length 4,096 (16×)', 'per-position loss at length 256 (1×)'."""
    return f"{kind} at length {length:,} ({multiple:g}×)"


@dataclass(frozen=True)
class Stage:
    """One pass of the evaluation at one length, as planned before it runs: its windows (or task
    instances), each ``length`` tokens long."""
    kind: str          # 'ppl', 'per-position loss', 'flip_flop accuracy'
    length: int
    multiple: float
    windows: int

    @property
    def label(self) -> str:
        return stage_label(self.kind, self.length, self.multiple)


def in_words(stages: Sequence[Stage]) -> str:
    """Stages said briefly, by kind: 'ppl at 4× and 16×; per-position loss at 1×, 4× and 16×'."""
    kinds: dict[str, list[str]] = {}
    for s in stages:
        kinds.setdefault(s.kind, []).append(f"{s.multiple:g}×")
    said = [f"{kind} at {', '.join(m[:-1])} and {m[-1]}" if len(m) > 1 else f"{kind} at {m[0]}"
            for kind, m in kinds.items()]
    return "; ".join(said)


def duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def stage_line(label: str, done: int, total: int | None, elapsed_s: float, unit: str = "windows") -> str:
    """A long stage under way: 'ppl at 4,096 (16×): 12/64 windows  0:00:30 elapsed  ETA 0:02:10'."""
    eta = elapsed_s / done * (total - done) if total and done else None
    count = f"{done:,}/{total:,}" if total else f"{done:,}"
    left = "-" if eta is None else duration(eta)
    return f"{label}: {count} {unit}  {duration(elapsed_s)} elapsed  ETA {left}"


class StageLines:
    """Progress of a wait without training steps (`posenc eval`: each length, and within a long
    one its batches of windows), as plain lines in training's style: one when a stage starts, one
    at most every `every_s` seconds while it runs (done/total, elapsed, ETA; the whole evaluation's
    ETA where a plan was given, the first time `first_s` after the first windows) and one with its
    result. Plain lines in a terminal too: a few per length, nothing to redraw, and a log read
    later shows where the time went."""

    def __init__(self, console: Console | None = None, every_s: float = 30.0, clock=time.monotonic,
                 first_s: float = 10.0) -> None:
        self.console = console or make_console()
        self.every_s, self.first_s, self.clock = every_s, first_s, clock
        self.label, self.done, self.total, self.started, self.last = "", 0, None, 0.0, 0.0
        self.cost: dict[str, float] = {}   # a planned stage's cost per window, by label
        self.planned: dict[str, int] = {}  # and its windows
        self.left = 0.0                    # the planned cost not yet computed (kept stages taken off)
        self.spent = 0.0                   # cost computed in finished stages of this process
        self.measured_s = 0.0              # the seconds they took
        self.said_overall = False
        self.finished: list[str] = []      # the stages ended or kept, by label

    def _print(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def plan(self, stages: Sequence[Stage], cost_per_token: Callable[[int], float]) -> None:
        """The stages the evaluation will run, for its overall ETA: each window costs its length ×
        cost_per_token(length) (the model's FLOPs per token at that length)."""
        self.cost = {s.label: s.length * cost_per_token(s.length) for s in stages}
        self.left = sum(self.cost[s.label] * s.windows for s in stages)
        self.planned = {s.label: s.windows for s in stages}

    def begin(self, label: str, total: int | None = None) -> None:
        self.label, self.done, self.total = label, 0, total
        self.started = self.last = self.clock()
        overall = self.overall()
        self._print(f"{label}: started" + (f" ({total:,} windows)" if total else "")
                    + (f"  ·  whole evaluation: ETA {overall}" if overall and self.spent else ""))

    def keep(self, label: str, result: str) -> None:
        """A stage finished by an earlier, interrupted evaluation: said, and not run again."""
        self.left -= self.cost.get(label, 0.0) * self.planned.get(label, 0)
        self.finished.append(label)
        self._print(f"{label}: {result}  (kept from the interrupted evaluation)")

    def overall(self) -> str | None:
        """The whole evaluation's time left, at the rate measured so far in this process."""
        if not self.cost or self.label not in self.cost:
            return None
        running = self.cost[self.label] * self.done
        done_s = self.measured_s + (self.clock() - self.started)
        if running + self.spent <= 0 or done_s <= 0:
            return None
        rate = (running + self.spent) / done_s  # cost per second
        return duration(max(0.0, self.left - running) / rate)

    def advance(self, n: int, total: int | None = None) -> None:
        """n more windows (or instances) done, of total where the caller knows it."""
        self.done += n
        self.total = total or self.total
        now = self.clock()
        first = not self.said_overall and self.cost and now - self.started >= self.first_s
        if now - self.last >= self.every_s or first:
            self.last = now
            overall = self.overall()
            self.said_overall = self.said_overall or overall is not None
            self._print(stage_line(self.label, self.done, self.total, now - self.started)
                        + (f"  ·  whole evaluation: ETA {overall}" if overall else ""))

    def end(self, result: str) -> None:
        elapsed = self.clock() - self.started
        if self.label in self.cost:  # what this stage cost, for the rate of those after it
            spent = self.cost[self.label] * self.planned.get(self.label, self.done)
            self.spent += spent
            self.left -= spent
            self.measured_s += elapsed
        self.finished.append(self.label)
        self._print(f"{self.label}: {result}  ({duration(elapsed)})")
