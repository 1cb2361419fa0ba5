"""Where flash-linear-attention's Triton kernels run, and importing them.

fla's kernels run on CUDA, and on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` in the
environment when Triton is imported: each ``@triton.jit`` kernel is then executed by numpy, one
program instance at a time). Both run the same kernels through the same adapters
(posenc/nn/encodings/fla_attention.py, posenc/nn/fla_kernels.py): the interpreter is how a CPU
machine tests the code a GPU run depends on, and a tiny run trains through it (slowly: seconds per
kernel call at T = 64). What the interpreter cannot show is the GPU's: shared memory and register
limits (a configuration too large for a GPU runs), Hopper's refusals (fla tests the GPU's name),
bf16 and TF32 arithmetic, races between program instances (docs/gpu.md).

Triton's autotuner times each of a kernel's configurations through the GPU driver before the first
call (``RuntimeError: 0 active drivers`` under the interpreter, which has none); ``import_fla``
leaves each of fla's autotuned kernels its first configuration under the interpreter, so nothing is
timed (fla's own autotuner subclasses Triton's ``Autotuner``).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from types import ModuleType

import torch

#: the values of TRITON_INTERPRET Triton reads as on (triton/knobs.py's ``env_bool``, libtriton's getenv_bool)
ON = ("1", "true", "on", "yes", "y")


def interpreting() -> bool:
    """Whether Triton's interpreter is asked for in this process (TRITON_INTERPRET, read as Triton reads
    it; Triton decides when a kernel is defined, so this is the environment fla was imported under)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ON


def fla_device(device: torch.device | str) -> bool:
    """Whether fla's kernels are tried on ``device``: CUDA, or the CPU under Triton's interpreter.
    Where triton or fla is then missing, importing the kernel says so (one warning per run)."""
    kind = torch.device(device).type
    return kind == "cuda" or (kind == "cpu" and interpreting())


def import_fla(module: str) -> ModuleType:
    """fla's module ``module`` (``fla.ops.forgetting_attn``), imported; under Triton's interpreter each
    of fla's autotuned kernels kept to its first configuration (the module doc)."""
    if not interpreting():
        return importlib.import_module(module)
    with warnings.catch_warnings():
        # fla finds no GPU driver and says it rolls back to the CPU: under the interpreter that is the point
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        found = importlib.import_module(module)
    one_configuration()
    return found


def one_configuration() -> None:
    """Every autotuned kernel of fla's loaded modules keeps its first configuration alone: with one,
    Triton's ``Autotuner.run`` launches it without timing anything (with several it benchmarks them
    through the GPU driver). Asked again after each import (a later import defines more kernels);
    a kernel already kept to one is left as it is."""
    autotuner, jit = sys.modules.get("triton.runtime.autotuner"), sys.modules.get("triton.runtime.jit")
    if autotuner is None or jit is None:  # no Triton imported: no kernel of fla's is Triton's here
        return
    for name, loaded in list(sys.modules.items()):
        if loaded is None or not (name == "fla" or name.startswith("fla.")):
            continue
        for value in list(vars(loaded).values()):
            # a kernel is a chain of wrappers (heuristics, autotune, jit) down to the Python function
            while isinstance(value, jit.KernelInterface):
                if isinstance(value, autotuner.Autotuner) and len(value.configs) > 1:
                    value.configs = value.configs[:1]
                value = getattr(value, "fn", None)
