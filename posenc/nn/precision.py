"""Computing a step in float32 under autocast: the recurrences, their state and the hand-written
backwards of the block's norms.

Autocast (``trainer.precision=bf16``) runs every matmul-like op in bf16, ``bmm``, ``baddbmm`` and
``linalg.vecdot`` included. A recurrence carries its state through T/C chunk-to-chunk products and
a T-long cumulative decay, so fla computes it in float32 whatever its inputs; an RMSNorm's mean of
squares loses digits in bf16; and an op with ``out=`` into a float32 buffer refuses bf16 operands
outright (``expected scalar type Float but found BFloat16``). ``without_autocast`` turns autocast
off for one function on its tensors' device; casting in and out is the function's own job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

F = TypeVar("F", bound=Callable)


def without_autocast(fn: F) -> F:
    """fn run with autocast off on the device of its first tensor argument."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        device = next((a.device.type for a in (*args, *kwargs.values()) if isinstance(a, Tensor)), "cpu")
        with torch.autocast(device, enabled=False):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
