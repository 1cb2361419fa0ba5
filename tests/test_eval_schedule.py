"""The training loop's evaluation schedule: denser over the first two eval intervals, so the
validation curve (and tokens-to-loss read from it) has more points where the loss falls fastest."""

from __future__ import annotations

from posenc.config import compose
from posenc.train.loop import eval_schedule


def test_the_default_schedule_evaluates_four_times_per_interval_early_then_every_interval():
    t = compose([], bench=False).trainer
    assert (t.eval_interval, t.early_evals, t.max_steps) == (50, 4, 300)
    assert eval_schedule(300, 50, 4) == [13, 25, 38, 50, 63, 75, 88, 100, 150, 200, 250, 300]


def test_early_evaluations_cost_a_fixed_number_whatever_the_run_length():
    for max_steps in (300, 1000, 10_000):
        extra = len(eval_schedule(max_steps, 50, 4)) - len(eval_schedule(max_steps, 50, 1))
        assert extra == 2 * (4 - 1)


def test_one_early_evaluation_per_interval_is_evenly_spaced_and_the_last_step_is_always_evaluated():
    assert eval_schedule(300, 50, 1) == [50, 100, 150, 200, 250, 300]
    assert eval_schedule(120, 50, 1) == [50, 100, 120]
    assert eval_schedule(30, 50, 4) == [13, 25, 30]  # a run shorter than the dense window


def test_the_schedule_never_repeats_a_step_even_when_the_interval_is_tiny():
    steps = eval_schedule(10, 2, 8)
    assert steps == sorted(set(steps)) and steps[:4] == [1, 2, 3, 4] and steps[-1] == 10
