"""When the training loop evaluates: denser early, where the loss falls fastest.

A loss curve drops steeply in its first few hundred steps, which is where tokens-to-loss
targets are usually crossed; evaluating only every ``trainer.eval_interval`` steps leaves few
points there. So over the first ``2·eval_interval`` steps the loop evaluates
``trainer.early_evals`` times per interval (default 4: steps 13, 25, 38, 50, 63, 75, 88, 100
for eval_interval=50), then every ``eval_interval`` steps, and always at the last step.
``early_evals=1`` gives evenly spaced evaluations. Each evaluation scores the same
``eval_batches·batch_size`` windows, so the extra early points cost
``2·(early_evals-1)`` evaluations per run, whatever its length.
"""

from __future__ import annotations

import math


def early_eval_steps(eval_interval: int, early_evals: int) -> set[int]:
    """The steps in (0, 2·eval_interval] at k·eval_interval/early_evals, rounded half up."""
    per = max(1, int(early_evals))
    return {max(1, math.floor(k * eval_interval / per + 0.5)) for k in range(1, 2 * per + 1)}


def is_eval_step(step: int, max_steps: int, eval_interval: int, early_evals: int = 1) -> bool:
    """Whether the loop evaluates after this step."""
    if step % eval_interval == 0 or step == max_steps:
        return True
    return step <= 2 * eval_interval and step in early_eval_steps(eval_interval, early_evals)


def eval_schedule(max_steps: int, eval_interval: int, early_evals: int = 1) -> list[int]:
    """Every step the loop evaluates at, in order (for tests and docs; the loop asks is_eval_step)."""
    return [s for s in range(1, max_steps + 1) if is_eval_step(s, max_steps, eval_interval, early_evals)]
