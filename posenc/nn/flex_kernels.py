"""Which FlexAttention kernel configurations a layer kind can take: its ladder.

FlexAttention's Triton kernels are generated per score_mod and shape when first called, so a
configuration can fail only then: shared memory beyond the device's (T5's captured table at head
dim 64 on sm_90 asked for 245,760 bytes of 232,448 with torch's default stages), a lowering this
torch lacks, a Triton error. A failure never ends a run. For each FlexAttention kernel of a layer
kind (its kind, encoding, head dim and dtype: a ``KernelKey``) posenc walks a ladder, one step per
failure, each step said in one ``warning:`` line per run that names the error and where it ended:

    torch's own choice  ->  smaller configurations that fit the device's shared memory
                        ->  the dense path (SDPA with an explicit mask, posenc/nn/attention.py)

The smaller configurations are derived from the device's shared memory per block and the head
dim: a forward holds the query tile (BLOCK_M x d) and, per pipeline stage, a key and a value tile
(BLOCK_N x d each); the backward's loops hold two tiles of each side and stream the other, so a
configuration is tried only where ``d · itemsize · (BLOCK_M + 2 · stages · BLOCK_N)`` bytes fit
(``num_stages=2`` is what T5 needed on sm_90). Block sizes divide the BlockMask's 128.

This module is the ladder alone, the same on every run of a device; where each kernel stands on
it belongs to the run (``KernelPolicy.flex_level``, posenc/nn/kernels.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


#: the configurations tried after torch's own, largest first (forward blocks, stages, warps);
#: the backward's four block sizes take the same BLOCK_M/BLOCK_N pair
CONFIGS: tuple[tuple[int, int, int, int], ...] = ((128, 64, 2, 4), (64, 64, 2, 4), (64, 32, 1, 4), (32, 32, 1, 4))
#: a step past the ladder: the layer kind computes its attention with an explicit mask
DENSE = "dense"
#: shared memory per block where the device does not say (sm_80's opt-in 163 KB would be larger)
DEFAULT_SHARED_MEMORY = 99 * 1024

KernelOptions = dict[str, int] | None


class KernelKey(NamedTuple):
    """A layer kind's FlexAttention kernels: the kind (posenc/nn/kernels.py), its encoding (name and
    class), head dim and dtype. A tuple: plan() builds one inside a compiled model's trace, which
    takes tuples as they are."""

    kind: str
    encoding: str
    head_dim: int
    dtype: str


def describe(key: KernelKey) -> str:
    return f"FlexAttention for the {key.kind} layers ({key.encoding}, head_dim {key.head_dim}, {key.dtype})"


#: shared memory per block, by device index: a property of the device, asked once, outside a trace where it can
_SHARED: dict[int, int] = {}


#: the dtypes attention runs in, by name (a lookup a compiled model's trace takes as a constant)
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def kernel_key(kind: str, encoding: torch.nn.Module, head_dim: int, dtype: torch.dtype) -> KernelKey:
    """The key of layer kind ``kind``'s FlexAttention kernels, its encoding ``encoding`` (name and class)."""
    what = f"encoding '{getattr(encoding, 'name', type(encoding).__name__)}' ({type(encoding).__qualname__})"
    return KernelKey(kind, what, int(head_dim), DTYPES.get(dtype, "float32"))


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


