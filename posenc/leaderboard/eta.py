"""How long a placement (or a reproduction) takes: one ETA for all its runs, from step times measured
on this machine, now.

The estimate used to be the shipped rows' run times (baselines/*.json, ``wall_time_s``): 7.0 min for
the median encoding, where placing RoPE took 51 s end to end (its six runs 34 s) on a 2-CPU machine
at a load of about 2. Those times were taken while ``--regenerate --jobs 2`` shared a 2-CPU machine
with other work (its 1-minute load average had a median of 22.3, the leaderboard page says), so every
run waited for a core most of the time: upper bounds, several times a quiet machine's, and no
estimate of this machine's.

So before its runs each arm is measured here, on one torch thread as the arms run
(posenc/cli/leaderboard_run.py: one_torch_thread): its model and data built (``setup_s``),
``WARM_STEPS`` training steps taken to warm up and ``PACE_STEPS`` more timed (``step_s``, their median:
the real ``train_step``), a validation and the end-of-run evaluation (extrapolation or task
accuracy, and the per-position loss) timed once each, after one at the first length alone has
imported what they need (seconds, once for the whole process: not a run's). A run is then setup + steps × step + its evaluations, an arm its seeds'
runs, the placement its arms'.
When an arm ends, the arms left are rescaled by how long the finished ones took against their estimate
(the machine's load moves, and each job's start-up and files are not measured), and the ETA said again.

Measured, placing RoPE on 2 CPUs at a load of about 4: estimated 0:32 before the runs, which took
0:37; after the lm arm (0:17 against 0:15), 0:18 for the rest, which took 0:20. Timing the arms costs
4.4 s (10 s in a fresh process, most of it imports the runs would otherwise make).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from omegaconf import DictConfig, OmegaConf

#: training steps timed per arm, after WARM_STEPS that warm up (allocations, caches)
PACE_STEPS = 8
WARM_STEPS = 2


@dataclass(frozen=True)
class Pace:
    """One arm's run as measured here: seconds to build it, per training step, per validation, and
    for its end-of-run evaluation; its steps and validations."""

    arm: str
    setup_s: float
    step_s: float
    steps: int
    validation_s: float
    validations: int
    evaluation_s: float

    @property
    def run_s(self) -> float:
        return self.setup_s + self.steps * self.step_s + self.validations * self.validation_s + self.evaluation_s

    def describe(self) -> str:
        """'lm 48 ms/step × 100 steps + 2.1 s to build and evaluate'."""
        rest = self.setup_s + self.validations * self.validation_s + self.evaluation_s
        return f"{self.arm} {self.step_s * 1e3:.0f} ms/step × {self.steps} steps + {rest:.1f} s to build and evaluate"


def clock_time(seconds: float) -> str:
    """0:01:44 as a person reads a duration."""
    return str(timedelta(seconds=round(max(0.0, seconds))))


def measure(cfg: DictConfig, arm: str) -> Pace:
    """``cfg`` (an arm's config, its encoding and first seed) timed on this process's threads (module doc)."""
    from posenc.build import build_data, build_model, seed_everything  # start-up: torch, when the command runs
    from posenc.eval.proof import kept_rng
    from posenc.hardware import setup_device
    from posenc.train.loop import eval_schedule
    from posenc.train.state import new_train_state

    t = cfg.trainer
    with kept_rng():  # the runs seed themselves; nothing here is theirs
        started = time.perf_counter()
        device, _, autocast = setup_device(cfg.device, t.precision)
        data = build_data(cfg)
        seed_everything(cfg.seed)
        model = build_model(cfg, data.vocab_size).to(device)
        state = new_train_state(model, t, data.batches(t.seq_len, t.batch_size, seed=cfg.seed), device, autocast)
        setup = time.perf_counter() - started
        step = step_time(state)
        validation, evaluated = evaluation_times(model, data, cfg, device, autocast)
    return Pace(arm, setup, step, int(t.max_steps), validation,
                len(eval_schedule(int(t.max_steps), int(t.eval_interval), int(t.early_evals))), evaluated)


def step_time(state) -> float:
    """Seconds of one real training step: the median of PACE_STEPS after WARM_STEPS that allocate."""
    from posenc.train.state import micro_batches, train_step

    for _ in range(WARM_STEPS):
        train_step(state, micro_batches(state))
    steps = []
    for _ in range(PACE_STEPS):
        started = time.perf_counter()
        train_step(state, micro_batches(state))
        steps.append(time.perf_counter() - started)
    return statistics.median(steps)  # a step another process held up is not the pace


def evaluation_times(model, data, cfg: DictConfig, device, autocast) -> tuple[float, float]:
    """Seconds of one validation and of the end-of-run evaluation (0 without one), each timed after a
    first that imports what it needs (datasets, scipy: seconds, once for the whole process)."""
    import torch

    from posenc.eval import evaluation, per_position
    from posenc.eval.loss import validator

    def timed(work) -> float:
        started = time.perf_counter()
        work()
        return time.perf_counter() - started

    def evaluate(at: DictConfig) -> None:
        evaluation.evaluate(data, model, at, device, autocast)
        per_position.per_position(model, evaluation.evaluation_batches(data, at), int(cfg.trainer.seq_len),
                                  device=device, autocast=autocast)

    model.eval()
    with torch.no_grad():
        validate = validator(model, data, cfg.trainer, device, autocast)
        validate()
        validation = timed(validate)
        if not cfg.eval.at_end:
            return validation, 0.0
        evaluate(first_length(cfg))
        return validation, timed(lambda: evaluate(cfg))


def first_length(cfg: DictConfig) -> DictConfig:
    """cfg evaluated at its first length alone (a corpus's eval.lengths, a task's dataset.eval_multiples):
    the cheapest evaluation that runs the code the whole one runs."""
    cheap = copy.deepcopy(cfg)
    for key in ("eval.lengths", "dataset.eval_multiples"):
        lengths = OmegaConf.select(cheap, key, default=None)
        if lengths:
            OmegaConf.update(cheap, key, [lengths[0]], merge=False)
    return cheap


@dataclass
class Clock:
    """The whole placement's time: each arm's seeds at its measured pace, and what the arms took."""

    paces: Sequence[Pace]
    seeds: int
    took: dict[str, float] = field(default_factory=dict)  # arm -> seconds its runs took
    started: float = field(default_factory=time.monotonic)

    def estimate(self, arm: str) -> float:
        return self.seeds * next(p for p in self.paces if p.arm == arm).run_s

    @property
    def total(self) -> float:
        return sum(self.estimate(p.arm) for p in self.paces)

    def left(self) -> float:
        """Seconds the arms not yet done will take: their estimate, times how the done ones compared."""
        done = [p.arm for p in self.paces if p.arm in self.took]
        scale = sum(self.took.values()) / sum(self.estimate(a) for a in done) if done else 1.0
        return scale * sum(self.estimate(p.arm) for p in self.paces if p.arm not in self.took)

    def arm_done(self, arm: str, seconds: float) -> None:
        self.took[arm] = seconds

    def plan(self) -> str:
        """The estimate before any run: '6 runs: about 0:00:52 here (a run of each arm timed now: lm …; …)'."""
        return (f"{self.runs}: about {clock_time(self.total)} here (a run of each arm timed on this machine now: "
                f"{'; '.join(p.describe() for p in self.paces)})")

    def progress(self) -> str:
        """After an arm: 'ETA 0:00:14 for the rest (lm took 0:00:20, estimated 0:00:19)'."""
        last = next(reversed(self.took))
        return (f"ETA {clock_time(self.left())} for the rest ({last} took {clock_time(self.took[last])}, "
                f"estimated {clock_time(self.estimate(last))})")

    def summary(self) -> str:
        """After the last arm: '6 runs took 0:01:01 (estimated 0:01:12 before they ran)'."""
        return f"{self.runs} took {clock_time(time.monotonic() - self.started)} (estimated {clock_time(self.total)} before they ran)"

    @property
    def runs(self) -> str:
        n = len(self.paces) * self.seeds
        return f"{n} run{'s' if n != 1 else ''}"
