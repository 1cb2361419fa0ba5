"""What a failed kernel or compilation was.

Kernels are compiled or first run inside a forward or a step, so their failures arrive there, as
exceptions wrapped by whoever caught them first: dynamo wraps a backend's failure in
``BackendCompilerFailed`` (its ``inner_exception``, raised ``from None``), inductor its own in
``InductorError`` (a subclass), AOTAutograd nothing. ``classify`` walks that chain once, by
``inner_exception`` where there is one and ``__cause__`` otherwise, and says what the error is:

- ``RECOMPILE_LIMIT``: dynamo refusing to compile a function once more (``FailOnRecompileLimitHit``,
  raised as an error within the run's ``KernelPolicy.compiling``);
- ``REFUSAL``: a kernel refusing this device or these versions: an encoding's own kernel raising
  ``KernelUnavailable`` (its message is what the run says), or flash-linear-attention refusing inside
  one of its kernels (a frame of the traceback in fla's package, and what fla raises to refuse,
  ``refuses``: a ``RuntimeError`` of a ``raise`` statement of fla's own, or Triton failing to build a
  kernel for the GPU); what fla asserts or raises about the arguments it was given is posenc's bug;
- ``COMPILE``: the compiler failing to build what it was given. Either an error of the compiler's
  own (``InductorError``, ``LoweringException``, ``NoTritonConfigsError``, a C++/CUDA compile error,
  Triton's ``OutOfResources`` or ``CompilationError``), or a ``BackendCompilerFailed`` whose innermost
  error was raised in the compiler's code (a frame under ``torch/_inductor`` or ``triton``);
- ``BUG``: anything else, re-raised. A ``BackendCompilerFailed`` whose innermost error was raised
  while AOTAutograd traced the model's own code (a custom op's fake or backward that is wrong, a
  score_mod that does not trace: tests/test_kernel_fallback.py) is a bug in that code, not a
  compilation to step around: training it uncompiled would hide it.

Where the failure came from in the model (a FlexAttention kernel: its name, ``flex_attention``,
is in the error's text) is read in the same walk. What runs instead is the run's policy's to decide
(``KernelPolicy.recover``, posenc/nn/kernels.py): this module only says what happened.
"""

from __future__ import annotations

import dis
import traceback
from dataclasses import dataclass

import torch

from posenc.nn import torch_private

#: what a failure is (``Failure.kind``)
RECOMPILE_LIMIT = "recompile_limit"
REFUSAL = "refusal"
COMPILE = "compile"
BUG = "bug"

#: attempts of one thing (a step, a FlexAttention call): each failure moves one layer kind down a
#: finite ladder (or the model to eager, or dynamo's recompile limit up), so something that still
#: fails after these is a bug to show
MAX_ATTEMPTS = 16
#: where a compiler's own code lives: an error raised there is the compiler failing
COMPILER_CODE = ("/torch/_inductor/", "/triton/")


class KernelUnavailable(RuntimeError):
    """What an encoding's own kernel raises when it cannot run here: from ``fused_attention`` (its library
    missing, a dtype, head dim or window it does not take) or when it runs (its library refusing). Its
    message is the run's one warning; the layer kind computes from the encoding's other hooks for the rest
    of the run, recorded as a fallback from ``fused:<op>`` with ``reason`` (by default the first line of
    the error it was raised from, else its message)."""

    def __init__(self, message: str, op: str = "fused_attention", reason: str | None = None) -> None:
        super().__init__(message)
        self.op, self.reason = op, reason


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
    layouts, float32 gates, head dims: posenc's adapters pass what it takes, posenc/nn/fla_kernels.py), an
    error torch raises inside fla's code (a shape, a device, a dtype), an error of Triton's interpreter
    running the kernel, running out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    if isinstance(error, torch_private.triton_errors()):
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
    """A classified failure (module doc): what it is, the innermost error's first line (what the run's
    record names), whether a FlexAttention kernel's name is in its text, and the words a refusal came
    with (a ``KernelUnavailable``'s message), which the run then says as they are."""

    error: BaseException
    kind: str
    reason: str
    flex: bool = False
    said: str | None = None


def classify(error: BaseException) -> Failure:
    """What ``error`` is (module doc), its cause chain walked once."""
    links = chain(error)
    inner = links[-1]
    reason = first_line(inner)
    flex = any("flex_attention" in str(e) for e in links)
    if any(isinstance(e, torch_private.recompile_limit_hit()) for e in links):
        return Failure(error, RECOMPILE_LIMIT, reason)
    refusal = next((e for e in links if isinstance(e, KernelUnavailable)), None)
    if refusal is not None:  # its reason: its own, else what it wraps (fla's error), else its message
        why = refusal.reason or (reason if inner is not refusal else str(refusal))
        return Failure(error, REFUSAL, why, said=str(refusal))
    if any(through(e, "/fla/") for e in links) and refuses(inner):
        return Failure(error, REFUSAL, reason)
    if any(isinstance(e, torch_private.compiler_errors()) for e in links):
        return Failure(error, COMPILE, reason, flex)
    if isinstance(error, torch_private.backend_failed()) and raised_in(inner, COMPILER_CODE):
        return Failure(error, COMPILE, reason, flex)
    return Failure(error, BUG, reason, flex)


def refusal(error: BaseException, said: str) -> Failure:
    """``error`` as a refusal whatever it is, said in the caller's words: a kernel tried alone on a small
    input, where any error is its library refusing (posenc/nn/fla_kernels.py's first use)."""
    return Failure(error, REFUSAL, first_line(error), said=said)

