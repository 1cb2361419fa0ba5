"""flash-linear-attention's naive reference implementations (fla/ops/<op>/naive.py: torch and einops
only), loaded from the installed package's files: importing them through the ``fla`` package
imports fla's Triton kernels first, which CPU-only torch does not ship. A test that needs one skips
with the reason where fla-core (the `test` extra) is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


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
