"""Which FlexAttention kernel configuration runs, and what happens when one fails to compile.

FlexAttention's Triton kernels are generated per score_mod and shape when first called, so a
configuration can fail only then: shared memory beyond the device's (T5's captured table at head
dim 64 on sm_90 asked for 245,760 bytes of 232,448 with torch's default stages), a lowering this
torch lacks, a Triton error. A failure never ends a run. For each layer kind (its encoding, head
dim and dtype: a ``KernelKey``) posenc walks a ladder, one step per failure, each step said in one
``warning:`` line per layer kind that names the error and where it ended:

    torch's own choice  ->  smaller configurations that fit the device's shared memory
                        ->  the dense path (SDPA with an explicit mask, posenc/nn/attention.py)

The smaller configurations are derived from the device's shared memory per block and the head
dim: a forward holds the query tile (BLOCK_M x d) and, per pipeline stage, a key and a value tile
(BLOCK_N x d each); the backward's loops hold two tiles of each side and stream the other, so a
configuration is tried only where ``d · itemsize · (BLOCK_M + 2 · stages · BLOCK_N)`` bytes fit
(``num_stages=2`` is what T5 needed on sm_90). Block sizes divide the BlockMask's 128.

Where a layer kind stands is process state (``_LEVEL``): a property of this device and torch
that every model of the process shares, as the warnings said once are. The kernels a failing
forward or step used are the ``active`` keys; the train step (posenc/train/state.py) and
``FlexPlan.attend`` (posenc/nn/flex.py) step them down and run again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch

from posenc.errors import warn_once

#: the configurations tried after torch's own, largest first (forward blocks, stages, warps);
#: the backward's four block sizes take the same BLOCK_M/BLOCK_N pair
CONFIGS: tuple[tuple[int, int, int, int], ...] = ((128, 64, 2, 4), (64, 64, 2, 4), (64, 32, 1, 4), (32, 32, 1, 4))
#: a step past the ladder: the layer kind computes its attention with an explicit mask
DENSE = "dense"
#: shared memory per block where the device does not say (sm_80's opt-in 163 KB would be larger)
DEFAULT_SHARED_MEMORY = 99 * 1024

KernelOptions = dict[str, int] | None


class KernelKey(NamedTuple):
    """A layer kind's FlexAttention kernels: its encoding (type and name), head dim and dtype. A
    tuple: plan() builds one inside a compiled model's trace, which takes tuples as they are."""

    encoding: str
    head_dim: int
    dtype: str


def describe(key: KernelKey) -> str:
    return f"FlexAttention for {key.encoding} (head_dim {key.head_dim}, {key.dtype})"


#: how far down its ladder each layer kind has stepped (0: torch's own choice)
_LEVEL: dict[KernelKey, int] = {}
#: the error that made each layer kind leave FlexAttention, for the plan's fallback reason
_FAILURE: dict[KernelKey, str] = {}
#: the first error of each layer kind that is stepping down and has not compiled yet
_PENDING: dict[KernelKey, str] = {}
#: the layer kinds whose FlexAttention kernels the current forward or step planned (see the module doc);
#: a dict used as an ordered set (a compiled model's trace records a dict's writes as it runs them)
active: dict[KernelKey, None] = {}
#: shared memory per block, by device index: asked of the device once, outside a trace where it can
_SHARED: dict[int, int] = {}


#: the dtypes attention runs in, by name (a lookup a compiled model's trace takes as a constant)
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def kernel_key(encoding: torch.nn.Module, head_dim: int, dtype: torch.dtype) -> KernelKey:
    """The key of a layer kind whose encoding is ``encoding`` (its name and class)."""
    what = f"encoding '{getattr(encoding, 'name', type(encoding).__name__)}' ({type(encoding).__qualname__})"
    return KernelKey(what, int(head_dim), DTYPES.get(dtype, "float32"))


def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one thread block may use on device (opt-in maximum where known)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return DEFAULT_SHARED_MEMORY
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED:
        props = torch.cuda.get_device_properties(index)
        _SHARED[index] = int(getattr(props, "shared_memory_per_block_optin", 0)
                             or getattr(props, "shared_memory_per_block", 0) or DEFAULT_SHARED_MEMORY)
    return _SHARED[index]


def fits(config: tuple[int, int, int, int], head_dim: int, itemsize: int, budget: int) -> bool:
    """Whether a configuration's tiles fit ``budget`` bytes (the module doc's estimate)."""
    block_m, block_n, stages, _ = config
    return head_dim * itemsize * (block_m + 2 * stages * block_n) <= budget


def ladder(head_dim: int, itemsize: int, budget: int) -> list[KernelOptions]:
    """The configurations to try, in order: torch's own (None), then each of CONFIGS that fits,
    as FlexAttention's ``kernel_options`` (the smallest is kept even when none fits: a last try)."""
    fitting = [c for c in CONFIGS if fits(c, head_dim, itemsize, budget)] or [CONFIGS[-1]]
    out: list[KernelOptions] = [None]
    for block_m, block_n, stages, warps in fitting:
        out.append({"BLOCK_M": block_m, "BLOCK_N": block_n, "num_stages": stages, "num_warps": warps,
                    "bwd_BLOCK_M1": min(block_m, block_n), "bwd_BLOCK_N1": block_n,
                    "bwd_BLOCK_M2": block_n, "bwd_BLOCK_N2": min(block_m, block_n)})
    return out


def options(key: KernelKey, device: torch.device) -> KernelOptions | str:
    """The kernel_options a layer kind compiles with now, or DENSE once its ladder is spent. Until
    a failure (level 0, torch's own choice) nothing is asked of the device: plan() calls this
    inside a compiled model's trace, and after a failure ``step_down`` has asked, outside it."""
    level = _LEVEL.get(key, 0)
    if level == 0:
        return None
    itemsize = ITEMSIZE.get(key.dtype, 4)
    steps = ladder(key.head_dim, itemsize, shared_memory(device))
    return steps[level] if level < len(steps) else DENSE


def failure(key: KernelKey) -> str | None:
    """Why a layer kind left FlexAttention (its last compile error), or None if it has not."""
    return _FAILURE.get(key)


def step_down(key: KernelKey, error: BaseException, device: torch.device) -> KernelOptions | str:
    """After ``error`` compiling ``key``'s kernels: its next configuration, or DENSE. The first
    error is kept for the one warning ``settled`` gives once a configuration compiles; reaching
    DENSE says so at once."""
    _LEVEL[key] = _LEVEL.get(key, 0) + 1
    _PENDING.setdefault(key, describe_error(error))
    nxt = options(key, device)
    if nxt == DENSE:
        why = _PENDING.pop(key)
        _FAILURE[key] = f"FlexAttention did not compile here ({why})"
        warn_once(f"{describe(key)} did not compile ({why}), nor did any smaller kernel configuration: "
                  f"attention falls back to SDPA with an explicit mask (slower, O(H·T²) memory per layer, "
                  f"query-chunked at long T); the run goes on")
    return nxt


def settled(keys: Iterable[KernelKey], device: torch.device) -> None:
    """After a forward or step that compiled: say once, for each layer kind that had to step down,
    which configuration it runs with and why (its first error)."""
    for key in list(keys):
        if key in _PENDING:
            why = _PENDING.pop(key)
            warn_once(f"{describe(key)} did not compile with torch's default configuration ({why}): "
                      f"it runs with kernel_options {options(key, device)} instead")


def describe_error(error: BaseException) -> str:
    """An exception and its first message line, the innermost cause's where it is wrapped."""
    inner = error
    while inner.__cause__ is not None and inner.__cause__ is not inner:
        inner = inner.__cause__
    first = next((line.strip() for line in str(inner).splitlines() if line.strip()), "")
    text = f"{type(inner).__name__}: {first}" if first else type(inner).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a failed compilation raises in this torch (and Triton, where installed)."""
    found: list[type[BaseException]] = []
    for module, names in (("torch._dynamo.exc", ("BackendCompilerFailed", "FailOnRecompileLimitHit")),
                          ("torch._inductor.exc", ("InductorError", "LoweringException")),
                          ("triton.runtime.errors", ("OutOfResources",)),
                          ("triton.compiler.errors", ("CompilationError",))):
        try:
            imported = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        found += [getattr(imported, n) for n in names if isinstance(getattr(imported, n, None), type)]
    return tuple(found)


def is_compile_error(error: BaseException) -> bool:
    """Whether error (or what it wraps) is a failed compilation rather than a bug to report."""
    kinds = compile_errors()
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ if seen.__cause__ is not seen else None
    return False


def mentions_flex(error: BaseException) -> bool:
    """Whether a compile error came from a FlexAttention kernel (its lowering or its Triton template)."""
    seen: BaseException | None = error
    while seen is not None:
        if "flex_attention" in str(seen) or "flex_attention" in type(seen).__name__.lower():
            return True
        seen = seen.__cause__ if seen.__cause__ is not seen else None
    return False


#: dynamo's recompile limit posenc runs with: a bench, `posenc check` or a sweep's jobs compile many
#: models (and score_mods) in one process, and past torch's default of 8 dynamo would run the rest
#: uncompiled without a word (FlexAttention then materialises every score)
RECOMPILE_LIMIT = 64


def loud_recompile_limit() -> None:
    """Raise dynamo's recompile limit to RECOMPILE_LIMIT and make reaching it an error posenc
    catches (``raise_recompile_limit``), never a silent fall to uncompiled code."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def is_recompile_limit(error: BaseException) -> bool:
    """Whether error is dynamo refusing to compile a function once more (its recompile limit, raised
    as an error under ``loud_recompile_limit`` or a fullgraph compile)."""
    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ == "FailOnRecompileLimitHit":
            return True
        seen = seen.__cause__ if seen.__cause__ is not seen else None
    return False


def raise_recompile_limit() -> None:
    """Double dynamo's recompile limit after it was reached, and say so once per new limit."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    limit = getattr(config, name) * 2
    setattr(config, name, limit)
    warn_once(f"this process compiled one function more often than dynamo's recompile limit allows (many models "
              f"or score_mods in one process): torch._dynamo.config.{name} raised to {limit} so that every "
              f"kernel stays compiled")
