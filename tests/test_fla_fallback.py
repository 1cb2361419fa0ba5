"""flash-linear-attention's refusal or absence never kills a run (posenc/nn/fla_kernels.py).

What a user on a GPU relies on: fla missing, failing at import, or refusing in its backward
(fla-core 0.6 on Hopper with Triton 3.4-3.7: ``RuntimeError: ... gated chunk_bwd_dqkwg (see #640)``)
gives one warning that names the error, then the chunked PyTorch recurrence, whose run is the run
without fla. fla is tried on a CPU where Triton's interpreter is asked for (TRITON_INTERPRET=1,
posenc/nn/fla_kernels.py), so these tests ask for it and put the fla they need where Python imports
it from (fla's real chunked kernels do not run in the interpreter: tests/test_fla_interpreter.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import TINY, run_cli, run_dirs
from fla_reference import fla_naive, varlen

from posenc.nn import fla_kernels
from posenc.nn.kernels import KernelPolicy, SaidOnce
from posenc.nn.kda import chunked_kda
from posenc.nn.recurrence import chunked_gated_delta_rule

#: fla-core 0.6's refusal, raised from the backward of chunk_gated_delta_rule (fla/ops/common/chunk_o.py)
HOPPER_REFUSAL = ("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
                  "chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1 or install tilelang: "
                  "`pip install tilelang`")
#: a hybrid with a gated_delta layer (the pattern is anchored at the last layer: recurrent, attention)
RUN = [*TINY, "model.n_layer=2", "layout=qwen3_next"]


@pytest.fixture
def fla_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """fla tried on the CPU (the interpreter asked for), no fla module imported, and the warnings the
    runs give about fla recorded (returned)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)
    warned: list[str] = []
    say = SaidOnce.__call__

    def heard(said: SaidOnce, message: str) -> None:  # what each run says about fla, as it says it
        if message not in said.said and "flash-linear-attention" in message:
            warned.append(message)
        say(said, message)

    monkeypatch.setattr(SaidOnce, "__call__", heard)
    return warned


def install_fla(monkeypatch: pytest.MonkeyPatch, kernel, rule: str = "gated_delta") -> None:
    """An importable fla module for ``rule`` (``fla.ops.gated_delta_rule``, ``fla.ops.kda``) whose
    kernel (``chunk_gated_delta_rule``, ``chunk_kda``) is ``kernel``."""
    module, name = fla_kernels.KERNELS[rule]
    for package in ("fla", "fla.ops", module):
        monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
    setattr(sys.modules[module], name, kernel)


def naive_gated_delta_rule():
    naive = fla_naive("gated_delta_rule/naive.py")
    return varlen(lambda q, k, v, g, beta, scale: naive.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale)[0])


def naive_kda():
    naive = fla_naive("kda/naive.py")
    return varlen(lambda q, k, v, g, beta, scale: naive.naive_recurrent_kda(q, k, v, g, beta, scale=scale)[0])


def refusing_kernel():
    """fla on Hopper with Triton 3.6: the forward computes, the backward refuses."""
    forward = naive_gated_delta_rule()

    class Refusing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta):
            return forward(q, k, v, g, beta, scale=1.0)[0]

        @staticmethod
        def backward(ctx, do):
            raise RuntimeError(HOPPER_REFUSAL)

    return lambda q, k, v, g, beta, scale=None, cu_seqlens=None: (Refusing.apply(q, k, v, g, beta), None)


def losses(cwd: Path) -> list[tuple[float | None, float | None]]:
    rows = [json.loads(line) for line in (run_dirs(cwd)[0] / "metrics.jsonl").read_text().splitlines()]
    return [(r["train/loss"], r.get("val/loss")) for r in rows if "event" not in r]  # a fallback is an event row


@pytest.fixture(scope="module")
def chunked_run(tmp_path_factory: pytest.TempPathFactory) -> list:
    """The run on the CPU as it always runs: the chunked PyTorch recurrence, fla never tried."""
    cwd = tmp_path_factory.mktemp("chunked")
    result = run_cli("train", *RUN, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return losses(cwd)


def no_fla(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setitem(sys.modules, "fla", None)  # `import fla` raises ModuleNotFoundError
    return "ModuleNotFoundError"


def refusing_fla(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    install_fla(monkeypatch, refusing_kernel())
    return f"RuntimeError: {HOPPER_REFUSAL}"


def fla_failing_at_import(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """An fla whose import raises something other than an ImportError (as a Triton that does not
    match fla's expectations can make it do)."""
    (tmp_path / "site" / "fla").mkdir(parents=True)
    (tmp_path / "site" / "fla" / "__init__.py").write_text("raise AttributeError('triton.language has no attribute x')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return "AttributeError: triton.language has no attribute x"


def installed_fla_without_triton(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The fla-core of the test extra on a CPU-only torch, which ships no Triton: its import fails."""
    if importlib.util.find_spec("fla") is None or importlib.util.find_spec("triton") is not None:
        pytest.skip("needs fla-core installed and Triton absent")
    return "ModuleNotFoundError: No module named 'triton'"


@pytest.mark.parametrize("fla", [no_fla, refusing_fla, fla_failing_at_import, installed_fla_without_triton],
                         ids=["absent", "refusing-in-backward", "failing-at-import", "installed-without-triton"])
def test_a_run_without_a_usable_fla_is_the_chunked_run_with_one_warning(fla, fla_on_cpu, chunked_run, monkeypatch,
                                                                       tmp_path):
    error = fla(monkeypatch, tmp_path)
    result = run_cli("train", *RUN, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert losses(tmp_path) == chunked_run
    assert len(fla_on_cpu) == 1, fla_on_cpu
    assert error in fla_on_cpu[0] and "chunk_gated_delta_rule" in fla_on_cpu[0]
    assert "use the chunked PyTorch recurrence" in fla_on_cpu[0]
    [run_dir] = run_dirs(tmp_path)  # and the run's record says which layer kind left fla's kernel, and when
    [fallback] = json.loads((run_dir / "summary.json").read_text())["kernels"]["fallbacks"]
    assert (fallback["layer_kind"], fallback["left"], fallback["took"]) == \
        ("recurrent", "fla:chunk_gated_delta_rule", "chunked")


@pytest.mark.parametrize("rule", ["gated_delta", "kda"])
def test_a_working_fla_computes_the_layer_and_is_tried_once(rule, fla_on_cpu, monkeypatch):
    """With a kernel that runs (fla's naive recurrence in its place, per cu_seqlens sequence), the
    layer's recurrence is the kernel's as the layer calls it (fla's layout, documents flattened
    with cu_seqlens, KDA's per-channel gates), equal to the chunked form; the kernel is tried once
    per dtype and head sizes (in an evaluation too), and no warning is given."""
    calls = []
    kernel = {"gated_delta": naive_gated_delta_rule, "kda": naive_kda}[rule]()
    install_fla(monkeypatch, lambda *a, **kw: (calls.append(1), kernel(*a, **kw))[1], rule)
    gen = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 2, 100, 16
    q, v = torch.randn(B, H, T, D, generator=gen), torch.randn(B, H, T, D, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=gen), dim=-1)
    g, beta = -torch.rand(B, H, T, *((D,) if rule == "kda" else ()), generator=gen), torch.rand(B, H, T, generator=gen)
    seg = torch.tensor([[0] * 30 + [1] * 70, [0] * T])
    policy = KernelPolicy()
    with torch.inference_mode():  # first used in an evaluation: the trial still runs a backward
        assert fla_kernels.usable(rule, q, v, policy) is not None
    found = fla_kernels.usable(rule, q, v, policy)
    assert found is not None and len(calls) == 1 and fla_on_cpu == []
    chunked = chunked_kda if rule == "kda" else chunked_gated_delta_rule
    torch.testing.assert_close(fla_kernels.mix(found, rule, q, k, v, g, beta, seg), chunked(q, k, v, g, beta, seg),
                               rtol=1e-4, atol=1e-4)
