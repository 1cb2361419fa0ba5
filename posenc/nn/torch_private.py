"""Every use posenc makes of torch's private API (a name under ``torch._``), in one place.

posenc supports torch 2.7.1 and later (pyproject). Where torch offers no public API for what posenc
needs, the private one is reached from here alone, each with the torch versions it serves and the
public API that replaces it where one exists, so that a torch release that moves one breaks one
module. Nothing here imports dynamo or inductor at import time (``posenc --help`` and an eager CPU
run never load them): each is imported where it is first used.

Each, as: the private API; what posenc uses it for; the torch versions it serves; its public
replacement.

- ``torch._disable_dynamo``: ``disable_dynamo``, a function run eagerly inside a compiled model; every
  torch of the range; ``torch.compiler.disable``, which imports dynamo (~3 s) when it decorates, that is
  when posenc's modules are imported.
- ``torch._dynamo.config.recompile_limit`` and ``fail_on_recompile_limit_hit``: ``recompile_limit_at``,
  the run's limit for the calls it compiles, restored after; 2.7 on, the floor (2.6 named the limit
  ``cache_size_limit`` and had no fail flag); none.
- ``torch._dynamo.exc``, ``torch._inductor.exc``, ``torch._inductor.runtime.triton_heuristics``:
  ``compiler_errors`` and the others, what a failed compilation raises (posenc/nn/failures.py); every
  torch with inductor; none (``torch.compile`` documents no exceptions).
- ``torch._dynamo.is_dynamo_supported``: ``dynamo_supported``, whether torch.compile runs on this Python;
  every torch of the range; none.
- ``torch._dynamo.backends.common.aot_autograd``: ``aot_autograd``, a backend that hands the joint graphs
  to posenc check's FlexAttention row; every torch of the range; none (``torch.compile`` takes a
  backend, not AOTAutograd's compilers).
- inductor's ``validate_joint_graph`` for FlexAttention's backward (``FLEX_RULE_MODULES``):
  ``flex_joint_graph_rule``; where this torch has it (a ``flex/`` package in recent torch, one module
  before); none.
- ``torch._dynamo.utils.counters`` and ``compilation_time_metrics``: ``compilations``, whether a timed
  bench round compiled; every torch of the range; none.

``torch._utils._flatten_dense_tensors`` (DDP's gradient buffer) is not used: the gradients are joined
with ``torch.cat`` (posenc/train/recovery.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)


def disable_dynamo(fn: F) -> F:
    """fn, run eagerly (one graph break) when a compiled model calls it: ``torch.compiler.disable``,
    whose dynamo import is deferred to fn's first call (torch's ``_disable_dynamo``)."""
    return torch._disable_dynamo(fn)


# --- dynamo's recompile limit --------------------------------------------------------------------------
#: its name in dynamo's config
RECOMPILE_LIMIT = "recompile_limit"


def recompile_limit() -> int:
    """dynamo's recompile limit as the process has it now."""
    import torch._dynamo.config as config

    return int(getattr(config, RECOMPILE_LIMIT))


@contextmanager
def recompile_limit_at(limit: int) -> Iterator[None]:
    """Within the block, dynamo recompiles one function up to ``limit`` times, and reaching it raises
    (``FailOnRecompileLimitHit``) instead of running the function uncompiled; outside it, dynamo's config
    is the process's as it was."""
    import torch._dynamo.config as config

    with config.patch({RECOMPILE_LIMIT: limit, "fail_on_recompile_limit_hit": True}):
        yield


# --- what a failed compilation raises ------------------------------------------------------------------
def _classes(spec: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for module, names in spec:
        try:
            imported = importlib.import_module(module)
        except ImportError:  # Triton is absent from a CPU-only torch
            continue
        found += [getattr(imported, n) for n in names if isinstance(getattr(imported, n, None), type)]
    return tuple(found)


def compiler_errors() -> tuple[type[BaseException], ...]:
    """The errors a compiler raises for what it could not build, in this torch (and Triton, where installed)."""
    return _classes((("torch._inductor.exc", ("InductorError", "LoweringException", "CppCompileError",
                                               "CUDACompileError")),
                     ("torch._inductor.runtime.triton_heuristics", ("NoTritonConfigsError",)),
                     ("triton.runtime.errors", ("OutOfResources",)),
                     ("triton.compiler.errors", ("CompilationError",))))


def backend_failed() -> tuple[type[BaseException], ...]:
    """dynamo's wrapper of a backend's failure (``BackendCompilerFailed``)."""
    return _classes((("torch._dynamo.exc", ("BackendCompilerFailed",)),))


def recompile_limit_hit() -> tuple[type[BaseException], ...]:
    """What dynamo raises at its recompile limit under ``recompile_limit_at``."""
    return _classes((("torch._dynamo.exc", ("FailOnRecompileLimitHit",)),))


def triton_errors() -> tuple[type[BaseException], ...]:
    """Triton failing to build a kernel for the GPU (Triton's own modules: public, where installed)."""
    return _classes((("triton.runtime.errors", ("OutOfResources", "PTXASError")),
                     ("triton.compiler.errors", ("CompilationError",))))


# --- posenc check: FlexAttention's backward rule -------------------------------------------------------
#: where inductor keeps FlexAttention's backward rule: recent torch in a flex/ package, earlier in one module
FLEX_RULE_MODULES = ("torch._inductor.kernel.flex.flex_attention", "torch._inductor.kernel.flex_attention")


def dynamo_supported() -> bool:
    """Whether torch.compile runs on this Python."""
    from torch._dynamo import is_dynamo_supported

    return bool(is_dynamo_supported())


def flex_joint_graph_rule(modules: tuple[str, ...] = FLEX_RULE_MODULES) -> Callable[[torch.fx.Graph], None] | None:
    """Inductor's ``validate_joint_graph`` (raises NotImplementedError on a graph it will not lower), or None
    where this torch has none."""
    for module in modules:
        try:
            return importlib.import_module(module).validate_joint_graph
        except (ImportError, AttributeError):
            continue
    return None


def aot_autograd(**compilers: Callable) -> Callable:
    """A dynamo backend through AOTAutograd with the given forward and backward compilers."""
    from torch._dynamo.backends.common import aot_autograd as backend

    return backend(**compilers)


# --- posenc bench: whether anything compiled -----------------------------------------------------------
def compilations() -> int:
    """How many compilation steps dynamo and AOTAutograd have run in this process: the count moves for a new
    or re-compiled forward graph and for a backward graph compiled on its first use, and never while compiled
    code runs."""
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except ImportError:  # a torch without dynamo compiles nothing
        return 0
    return counters["frames"]["total"] + sum(len(times) for times in compilation_time_metrics.values())
