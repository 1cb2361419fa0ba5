"""The run whose plan is being made, for what an encoding's own kernel has to say.

``fused_attention`` is a plug-in's hook and takes no policy (posenc/nn/kernels.py); a warning it
gives (fla absent, a window its kernel does not take) is still the run's: ``planning`` sets the
policy around the hook's call, outside any trace, and ``say`` warns through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from posenc.errors import warn_once

if TYPE_CHECKING:
    from posenc.nn.kernels import KernelPolicy

#: the policy of the plan being made, for what an encoding's own kernel (``fused_attention``, a
#: plug-in's hook that takes no policy) has to say; set around the hook's call, outside any trace
_planning: ContextVar[KernelPolicy | None] = ContextVar("posenc_kernel_policy", default=None)


@contextmanager
def planning(policy: KernelPolicy) -> Iterator[None]:
    token = _planning.set(policy)
    try:
        yield
    finally:
        _planning.reset(token)


def say(message: str) -> None:
    """A warning from inside a plan being made: once per run where a run's policy makes the plan,
    once per process outside one."""
    policy = _planning.get()
    if policy is not None:
        policy.warn(message)
    else:
        warn_once(message, stacklevel=3)
