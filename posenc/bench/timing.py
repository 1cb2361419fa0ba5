"""Timing one model's training step: exactly train_step, the function `posenc train` runs.

A Subject is a TrainState (optimizer, LR schedule, gradient accumulation, clipping, compile:
all as training builds them, by ``new_train_state``) fed one fixed batch, so the clock
measures the step and not the data pipeline. The first steps compile and fill caches; they
are timed apart (``first_step_s``, ``warmup_s``) and left out of the rate, which is the median
over ``rounds`` rounds of ``steps`` steps.

No timed round contains a compilation: dynamo compiles on first use and again whenever a guard
fails (a new shape, another model's score_mod, a kernel configuration stepped down), and a round
that did so read 4-7x (180x with one step) on an H200. ``clean_round`` watches dynamo's count of
compilations (forward and backward graphs) and takes a round that compiled again, untimed the
first time; a row says how many rounds it re-took (``retimed``).

Rounds are interleaved with the baselines' (``others``: the reference and NoPE, kept alive):
after each round of the model under test, each baseline runs one round too, so every ratio
(``vs_nope``) is a median of ratios taken under the same load, seconds apart. Timed one model
after another, a machine that got busier in between moved the ratios (ALiBi measured at 0.14×
NoPE on a loaded machine, 1.00× on a quiet one); paired, a busy machine slows both sides.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from posenc.bench.memory import sync
from posenc.bench.reference import REFERENCE, PlainGPT, recipe_of
from posenc.build import build_model, seed_everything
from posenc.data.batches import Batch
from posenc.nn import torch_private
from posenc.train.state import (
    BatchSource,
    TrainState,
    micro_batches,
    new_train_state,
    train_step,
)


class FixedBatch:
    """A batch source that hands out the same batch every time: the bench's data."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def next(self) -> Batch:
        return self.batch


@dataclass
class Subject:
    """One model under test: its TrainState and what the row reports about it."""

    name: str
    state: TrainState
    flops_per_token: float
    options: dict


@dataclass
class Timing:
    first_step_s: float        # the first step alone: compilation, allocator, caches
    warmup_s: float            # every untimed step, the first included
    round_s: list[float]       # seconds of each timed round
    tokens_per_step: int       # over all micro-batches of one optimizer step
    paired_s: dict[str, list[float]] = field(default_factory=dict)  # each baseline's round right after each of ours
    retimed: int = 0           # rounds (ours or a baseline's) taken again because they compiled


def build_subject(name: str, cfg: DictConfig, vocab: int, batches: BatchSource, device: torch.device,
                  autocast) -> Subject:
    """The model (the encoding's, or the plain reference) and its TrainState, built as
    training builds them from the same seed, at bench.seq_len, fed by ``batches``."""
    seed_everything(cfg.seed)
    T = int(cfg.bench.seq_len)
    if name == REFERENCE:
        m = cfg.model
        # the recipe posenc's models take (the bench's result names it once, for every row)
        model, options = PlainGPT(vocab, T, m.n_layer, m.n_head, m.d_model, recipe_of(m)), {}
    else:
        model = build_model(cfg, vocab)
        model.encoding.check_length(T)  # learned beyond max_len: PositionOutOfRange, this row fails
        options = model.encoding.options()
    model.to(device).train()
    state = new_train_state(model, cfg.trainer, batches, device, autocast)
    return Subject(name, state, model.flops_per_token(T), options)


def run_steps(subject: Subject, steps: int) -> None:
    """``steps`` training steps, exactly as the training loop takes them."""
    for _ in range(steps):
        train_step(subject.state, micro_batches(subject.state))


def timed_round(subject: Subject, steps: int) -> float:
    """Seconds of ``steps`` training steps, the device's queue drained before and after."""
    device = subject.state.device
    sync(device)
    start = time.perf_counter()
    run_steps(subject, steps)
    sync(device)
    return time.perf_counter() - start


#: times a round is taken again when it compiled; past it the last round stands (its row says so)
MAX_RETIMES = 3


def compilations() -> int:
    """How many compilation steps dynamo and AOTAutograd have run in this process (posenc/nn/torch_private.py)."""
    return torch_private.compilations()


def clean_round(subject: Subject, steps: int) -> tuple[float, int]:
    """A timed round in which nothing compiled, and how many rounds were taken again to get it."""
    for retimes in range(MAX_RETIMES + 1):
        before = compilations()
        seconds = timed_round(subject, steps)
        if compilations() == before:
            return seconds, retimes
    return seconds, MAX_RETIMES


def time_subject(subject: Subject, warmup: int, steps: int, rounds: int, others: Sequence[Subject] = (),
                 on_round: Callable[[int], None] | None = None) -> Timing:
    """Warm up (the first step timed alone), then ``rounds`` timed rounds of ``steps`` steps,
    each followed by one round of every subject in ``others`` (already warm). on_round(r) is told
    as round r (1-based) starts, for the bench's progress."""
    device = subject.state.device
    start = time.perf_counter()
    run_steps(subject, min(1, warmup))
    sync(device)
    first = time.perf_counter() - start
    run_steps(subject, max(0, warmup - 1))
    sync(device)
    warm = time.perf_counter() - start
    round_s, paired_s, retimed = [], {o.name: [] for o in others}, 0
    tokens_before, steps_before = subject.state.tokens, subject.state.step
    for r in range(rounds):
        if on_round is not None:
            on_round(r + 1)
        for who, times in ((subject, round_s), *((o, paired_s[o.name]) for o in others)):
            seconds, again = clean_round(who, steps)
            times.append(seconds)
            retimed += again
    taken = subject.state.step - steps_before  # steps * rounds, and the steps of rounds taken again
    tokens_per_step = (subject.state.tokens - tokens_before) // max(1, taken)
    return Timing(first if warmup else 0.0, warm if warmup else 0.0, round_s, tokens_per_step, paired_s, retimed)


def rate(timing: Timing, steps: int, flops_per_token: float, peak: float | None) -> dict:
    """ms/step (median round, and the best: noise on a shared machine only adds time),
    tokens/s and MFU = tokens/s · FLOPs/token / peak FLOP/s."""
    ms = statistics.median(timing.round_s) / steps * 1e3
    tps = timing.tokens_per_step / (ms / 1e3)
    return {
        "ms_per_step": ms, "tokens_per_s": tps,
        "ms_per_step_rounds": [t / steps * 1e3 for t in timing.round_s],
        "ms_per_step_best": min(timing.round_s) / steps * 1e3,
        "mfu": tps * flops_per_token / peak if peak else None,
        "first_step_s": timing.first_step_s, "warmup_s": timing.warmup_s, "retimed": timing.retimed,
        # throughput relative to each baseline, round by round (the same batch, so a ratio of times)
        "paired": {name: [b / a for a, b in zip(timing.round_s, other)] for name, other in timing.paired_s.items()},
        # each baseline's own rate in the rounds paired with ours: what a ratio is "of", under the same load
        "paired_tokens_per_s": {name: timing.tokens_per_step * steps / statistics.median(other)
                                for name, other in timing.paired_s.items() if other},
    }
