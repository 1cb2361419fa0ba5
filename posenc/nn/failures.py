"""What a failed kernel, compilation or step was, and the one loop that tries again.

Kernels are compiled or first run inside a forward or a step, so their failures arrive there, as
exceptions wrapped by whoever caught them first: dynamo wraps a backend's failure in
``BackendCompilerFailed`` (its ``inner_exception``, raised ``from None``), inductor its own in
``InductorError`` (a subclass), AOTAutograd nothing. ``classify`` walks that chain once, by
``inner_exception`` where there is one and ``__cause__`` otherwise, and says what the error is:

- ``RECOMPILE_LIMIT``: dynamo refusing to compile a function once more (``FailOnRecompileLimitHit``,
  raised as an error under ``loud_recompile_limit``);
- ``FLA_REFUSAL``: flash-linear-attention refusing inside one of its kernels (a frame of the
  traceback in fla's package, and what fla raises to refuse, ``refuses``: a ``RuntimeError`` of a
  ``raise`` statement of fla's own, or Triton failing to build a kernel for the GPU); what fla asserts
  or raises about the arguments it was given is posenc's bug, raised;
- ``COMPILE``: the compiler failing to build what it was given. Either an error of the compiler's
  own (``InductorError``, ``LoweringException``, ``NoTritonConfigsError``, a C++/CUDA compile error,
  Triton's ``OutOfResources`` or ``CompilationError``), or a ``BackendCompilerFailed`` whose innermost
  error was raised in the compiler's code (a frame under ``torch/_inductor`` or ``triton``);
- ``BUG``: anything else, re-raised. A ``BackendCompilerFailed`` whose innermost error was raised
  while AOTAutograd traced the model's own code (a custom op's fake or backward that is wrong, a
  score_mod that does not trace: tests/test_kernel_fallback.py) is a bug in that code, not a
  compilation to step around: training it uncompiled would hide it.

Where the failure came from in the model (a FlexAttention kernel: its name, ``flex_attention``,
is in the error's text; fla's package in the traceback) is read in the same walk.

``retry`` is the one loop that takes something again after a failure (a FlexAttention call in an
eager forward, posenc/nn/kernels.py; a training step, posenc/train/state.py): the caller's
``recover`` turns a classified failure into a change of what runs (True: try again) or refuses it.

The backend a compiled model is built with is ``compile_backend()``: torch's inductor, unless
``POSENC_COMPILE_BACKEND`` names another (``aot_eager``, or ``module:attribute`` of a callable):
a debugging aid, and how the tests inject a GPU's compile errors into a real ``torch.compile`` on
a CPU.
"""

from __future__ import annotations

import dis
import functools
import importlib
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

#: what a failure is (``Failure.kind``)
RECOMPILE_LIMIT = "recompile_limit"
FLA_REFUSAL = "fla_refusal"
COMPILE = "compile"
BUG = "bug"

#: attempts of one thing (a step, a FlexAttention call): each failure moves one layer kind down a
#: finite ladder (or the model to eager, or dynamo's recompile limit up), so something that still
#: fails after these is a bug to show
MAX_ATTEMPTS = 16
#: where a compiler's own code lives: an error raised there is the compiler failing
COMPILER_CODE = ("/torch/_inductor/", "/triton/")
#: the environment variable naming another compile backend (module doc)
BACKEND_VARIABLE = "POSENC_COMPILE_BACKEND"

T = TypeVar("T")


def _classes(spec: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for module, names in spec:
        try:
            imported = importlib.import_module(module)
        except ImportError:  # Triton is absent from a CPU-only torch
            continue
        found += [getattr(imported, n) for n in names if isinstance(getattr(imported, n, None), type)]
    return tuple(found)


@functools.cache
def compiler_errors() -> tuple[type[BaseException], ...]:
    """The errors a compiler raises for what it could not build, in this torch (and Triton, where installed)."""
    return _classes((("torch._inductor.exc", ("InductorError", "LoweringException", "CppCompileError",
                                               "CUDACompileError")),
                     ("torch._inductor.runtime.triton_heuristics", ("NoTritonConfigsError",)),
                     ("triton.runtime.errors", ("OutOfResources",)),
                     ("triton.compiler.errors", ("CompilationError",))))


@functools.cache
def backend_failed() -> tuple[type[BaseException], ...]:
    return _classes((("torch._dynamo.exc", ("BackendCompilerFailed",)),))


@functools.cache
def recompile_limit_hit() -> tuple[type[BaseException], ...]:
    return _classes((("torch._dynamo.exc", ("FailOnRecompileLimitHit",)),))


@functools.cache
def triton_errors() -> tuple[type[BaseException], ...]:
    return _classes((("triton.runtime.errors", ("OutOfResources", "PTXASError")),
                     ("triton.compiler.errors", ("CompilationError",))))


def chain(error: BaseException) -> list[BaseException]:
    """error and what it wraps, outermost first: ``inner_exception`` (dynamo's and inductor's
    wrappers, raised ``from None``) where there is one, else ``__cause__``; each once."""
    out: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and all(seen is not e for e in out):
        out.append(seen)
        inner = getattr(seen, "inner_exception", None)
        seen = inner if isinstance(inner, BaseException) else seen.__cause__
    return out


def first_line(error: BaseException) -> str:
    """'TypeName: first line of the message' (240 characters at most)."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def raised_in(error: BaseException, places: tuple[str, ...]) -> bool:
    """Whether the innermost frame of error's traceback (where it was raised) is in one of places."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and any(p in frames[-1].filename.replace("\\", "/") for p in places)


def through(error: BaseException, place: str) -> bool:
    """Whether any frame of error's traceback is in place (a package's directory, '/fla/')."""
    return any(place in f.filename.replace("\\", "/") for f in traceback.extract_tb(error.__traceback__))


def refuses(error: BaseException) -> bool:
    """Whether an error raised by an fla kernel's call is fla refusing this device or versions, not the
    arguments posenc gave it. A refusal is

    - a RuntimeError fla raises itself (``raised_by``: a ``raise`` statement in fla's package), as fla 0.6
      refuses the gated backward on Hopper GPUs with Triton 3.4 to 3.7.0 (fla/ops/common/chunk_o.py);
    - Triton failing to build a kernel for the GPU (out of shared memory or registers, ptxas, a
      compilation error).

    Not a refusal, a bug to see: what fla asserts or raises as a ValueError about its inputs (shapes,
    layouts, float32 gates, head dims: posenc's adapters pass what it takes, posenc/nn/encodings/
    fla_attention.py), an error torch raises inside fla's code (a shape, a device, a dtype), an error of
    Triton's interpreter running the kernel, running out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, triton_errors()):
        return True
    return isinstance(error, RuntimeError) and raised_by(error, "/fla/")


def raised_by(error: BaseException, place: str) -> bool:
    """Whether error was raised by a ``raise`` statement of code in place (a package's directory): its
    innermost frame is there and stopped on a raise. An error a C++ operator raised while that code called
    it stops the frame on the call instead (torch's shape and dtype errors inside fla's functions)."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return (place in code.co_filename.replace("\\", "/")
            and dis.opname[code.co_code[tb.tb_lasti]] == "RAISE_VARARGS")


@dataclass(frozen=True)
class Failure:
    """A classified failure (module doc): what it is, the innermost error's first line (what a
    warning and the run's record name), whether a FlexAttention kernel's name is in its text."""

    error: BaseException
    kind: str
    reason: str
    flex: bool = False

    @property
    def recoverable(self) -> bool:
        return self.kind != BUG


def classify(error: BaseException) -> Failure:
    """What ``error`` is (module doc), its cause chain walked once."""
    links = chain(error)
    inner = links[-1]
    reason = first_line(inner)
    flex = any("flex_attention" in str(e) for e in links)
    if any(isinstance(e, recompile_limit_hit()) for e in links):
        return Failure(error, RECOMPILE_LIMIT, reason)
    if any(through(e, "/fla/") for e in links) and refuses(inner):
        return Failure(error, FLA_REFUSAL, reason)
    if any(isinstance(e, compiler_errors()) for e in links):
        return Failure(error, COMPILE, reason, flex)
    if isinstance(error, backend_failed()) and raised_in(inner, COMPILER_CODE):
        return Failure(error, COMPILE, reason, flex)
    return Failure(error, BUG, reason, flex)


def retry(attempt: Callable[[], T], recover: Callable[[Failure], bool], attempts: int = MAX_ATTEMPTS) -> T:
    """attempt() until it returns; after each failure ``recover(classify(error))`` changes what runs
    and says whether to try again (False: the error is raised, as it is after the last attempt)."""
    for n in range(attempts):
        try:
            return attempt()
        except Exception as error:  # noqa: BLE001 - recover() chooses; whatever it refuses is raised
            if n == attempts - 1 or not recover(classify(error)):
                raise
    raise AssertionError("unreachable")  # the last attempt returns or raises


# --- dynamo's recompile limit: a process setting ---------------------------------------------------
#: dynamo's recompile limit posenc runs with: a bench, `posenc check` or a sweep's jobs compile many
#: models (and score_mods) in one process, and past torch's default of 8 dynamo would run the rest
#: uncompiled without a word (FlexAttention then materialises every score)
RECOMPILE_LIMIT_VALUE = 64


def _limit_name() -> str:
    config = torch._dynamo.config
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def recompile_limit() -> int:
    return int(getattr(torch._dynamo.config, _limit_name()))


def loud_recompile_limit() -> None:
    """Raise dynamo's recompile limit to RECOMPILE_LIMIT_VALUE and make reaching it an error posenc
    catches (``raise_recompile_limit``), never a silent fall to uncompiled code."""
    config = torch._dynamo.config
    name = _limit_name()
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT_VALUE))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def raise_recompile_limit() -> str:
    """Double dynamo's recompile limit after it was reached; what was done, in words."""
    name = _limit_name()
    limit = getattr(torch._dynamo.config, name) * 2
    setattr(torch._dynamo.config, name, limit)
    return f"torch._dynamo.config.{name} raised to {limit}"


# --- the compile backend -------------------------------------------------------------------------
def compile_backend() -> str | Callable:
    """What torch.compile builds a model with: 'inductor', or what POSENC_COMPILE_BACKEND names
    (a registered backend, or ``module:attribute``)."""
    named = os.environ.get(BACKEND_VARIABLE, "").strip()
    if not named:
        return "inductor"
    if ":" not in named:
        return named
    module, _, attribute = named.partition(":")
    return getattr(importlib.import_module(module), attribute)
