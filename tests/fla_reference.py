"""flash-linear-attention's naive reference implementations (fla/ops/<op>/naive.py: torch and einops
only), loaded from the installed package's files: importing them through the ``fla`` package
imports fla's Triton kernels first, which CPU-only torch does not ship. A test that needs one skips
with the reason where fla-core (the `test` extra) is not installed."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


def fla_naive(path: str) -> ModuleType:
    """The module fla/ops/<path> (e.g. "gated_delta_rule/naive.py")."""
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("flash-linear-attention (fla-core) is not installed: pip install -e '.[test]'")
    if importlib.util.find_spec("einops") is None:
        pytest.skip("fla's naive references need einops")
    file = Path(spec.submodule_search_locations[0]) / "ops" / path
    if not file.exists():
        pytest.skip(f"this fla has no {path}")
    module_spec = importlib.util.spec_from_file_location(f"fla_naive_{path.replace('/', '_')[:-3]}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def varlen(naive: Callable) -> Callable:
    """fla's kernel signature, ``kernel(q, k, v, g[, beta], scale=, cu_seqlens=) -> (o, None)`` on
    (B, T, H, ·) tensors, computed by ``naive(q, k, v, g[, beta], scale=) -> o``, one of fla's naive
    recurrences (which take no cu_seqlens) in the kernel's argument order, run on each packed
    sequence alone: what fla's chunked kernel computes, without Triton."""

    def kernel(q, k, v, g, *beta, scale=None, cu_seqlens=None, **_):
        if cu_seqlens is None:
            return naive(q, k, v, g, *beta, scale=scale), None
        bounds = cu_seqlens.tolist()
        outs = [naive(*(t[:, a:b] for t in (q, k, v, g, *beta)), scale=scale) for a, b in itertools.pairwise(bounds)]
        return torch.cat(outs, dim=1), None

    return kernel
