"""fla's Triton kernels, run: FoX, FoX-RoPE, PaTH, PaTH-FoX and stick-breaking through their real
kernels on a CPU, under Triton's interpreter, through the adapters and the plan a GPU run takes
(posenc/nn/fla_kernels.py): nothing is stubbed.

- the layer through fla's kernel (float32, what fla takes) equals posenc's float64 path from the
  encoding's hooks, values and gradients of q, k, v and every parameter of the encoding, under the
  causal mask and under documents (cu_seqlens), at head_dim 64 and T = 128, as close as posenc's own
  float32 path comes; the run's record names fla's op and holds no fallback;
- `posenc train` at a tiny shape trains through fla's kernel, and its summary.json says so;
- `posenc check`'s fused-kernel row compares fla's kernel, and says so;
- an adapter's bug that fla or torch reject (a layout, a dtype) reaches the caller as the error, not
  as a recorded fallback blamed on fla;
- fla's chunked recurrences (gated delta rule, KDA) do not run in the interpreter: a hybrid run says
  so in one warning and takes the chunked recurrence (their kernels are tested on a GPU,
  scripts/gpu_check.sh).

Triton's interpreter is on or off for a process when Triton is imported (its language's own
functions are defined interpreted or compiled then), and torch imports Triton with its compiler, so
these tests run in a process started with TRITON_INTERPRET=1: in the suite, ``test_under_the_interpreter``
runs this module in a pytest of its own (the other tests skip in the suite's process). Locally:

    TRITON_INTERPRET=1 pytest -n 0 tests/test_fla_interpreter.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import TINY, cli_env, run_cli, run_dirs
from fla_cases import FUSED, assert_close, context, encoding_of, inputs, layer_and_grads, segments_of

from posenc.errors import PosencWarning
from posenc.nn import attention, kernels
from posenc.nn import fla_kernels
from posenc.nn.fla_kernels import interpreting
from posenc.nn.mask import Window

INSTALLED = all(importlib.util.find_spec(m) is not None for m in ("triton", "fla"))
pytestmark = pytest.mark.skipif(not INSTALLED, reason="needs Triton and flash-linear-attention: "
                                "pip install -e '.[test,fla]' triton==3.9.0")
interpreted = pytest.mark.skipif(not interpreting(), reason="run under TRITON_INTERPRET=1 by test_under_the_interpreter")

#: each encoding's fla op, as the run's record names its path
OPS = {"fox": "parallel_forgetting_attn", "fox_rope": "parallel_forgetting_attn", "path": "parallel_path_attn",
       "path_fox": "parallel_path_attn", "stick_breaking": "parallel_stickbreaking_attn"}
#: T and the batch: head_dim 64 (fla_cases), T = 128 (two of fla's 64-token blocks, the cross-block terms
#: of its algorithms); one row under the causal mask, two under documents (the rows flattened into one
#: sequence, cu_seqlens at each document and row): 1-8 s per case in the interpreter
T = 128
BATCH = {"causal": 1, "documents": 2}
#: fla's kernel in float32 against posenc's float64, relative to each tensor's largest value. Measured at T = 128
#: (output; gradients): FoX, FoX-RoPE and stick-breaking 2e-7-9e-7 (posenc's own float32 path: the same);
#: PaTH and PaTH-FoX under documents 2e-7; 1e-6, causal 4e-5; 3e-5: fla's PaTH kernel itself differs from fla's
#: naive PaTH by 2e-7 at T = 64 and 6e-5 at T = 128, 1.2e-4 at T = 256 (past one of its 64-token blocks;
#: posenc's own float32 path: 2e-7)
TOLERANCE = {"fox": 1e-5, "fox_rope": 1e-5, "stick_breaking": 1e-5, "path": 2e-4, "path_fox": 2e-4}


@pytest.mark.slow  # a minute of one core
def test_under_the_interpreter():
    """This module's tests, in a pytest of their own under TRITON_INTERPRET=1 (the module doc)."""
    if interpreting():
        pytest.skip("this process is the interpreter's")
    env = cli_env() | {"TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                             "--durations=0", "--durations-min=1", __file__],
                            cwd=Path(__file__).parent.parent, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ passed, 1 skipped", summary), result.stdout[-3000:]  # skipped: this test alone


@interpreted
@pytest.mark.parametrize("mask", ["causal", "documents"])
@pytest.mark.parametrize("name", FUSED)
def test_flas_kernel_computes_posencs_definition(name, mask):
    """The layer through fla's Triton kernel (the plan attention takes, fed what posenc feeds it) equals
    posenc's own path from the encoding's hooks in float64: output, and gradients of q, k, v and every
    parameter of the encoding (FoX's gates, PaTH's projections, convolution and β); the run's record
    names fla's op, and nothing fell back."""
    batch = BATCH[mask]
    doc = segments_of(T, 2, batch) if mask == "documents" else None
    with pytest.MonkeyPatch.context() as own:  # posenc's own path: the plan from the encoding's hooks
        own.setattr(attention, "fused_plan", lambda *args: None)
        _, expected, expected_grads = layer_and_grads(encoding_of(name), context(T, doc, Window(), torch.float64),
                                                      *inputs(T, seed=4, batch=batch))
    policy = kernels.KernelPolicy()
    encoding = encoding_of(name, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PosencWarning)  # taken silently
        chosen, out, grads = layer_and_grads(encoding, context(T, doc, Window(), torch.float32),
                                             *inputs(T, seed=4, dtype=torch.float32, batch=batch), policy=policy)
    record = policy.record()
    assert record["layer_kinds"][name]["path"] == f"fused:{OPS[name]}" and not chosen.failed
    assert record["fallbacks"] == []
    assert_close(out, expected, TOLERANCE[name], f"{name} under {mask}: the layer's output")
    for n, g, e in zip(["q", "k", "v", *(n for n, _ in encoding.named_parameters())], grads, expected_grads):
        assert_close(g, e, TOLERANCE[name], f"{name} under {mask}: the gradient of {n}")

@interpreted
@pytest.mark.parametrize("name", ["fox", "path", "stick_breaking"])
def test_a_run_trains_through_flas_kernel(name, tmp_path):
    """`posenc train` on a CPU under the interpreter trains through fla's kernel: its summary.json names
    fla's op as the layers' path, with no fallback and no warning about fla."""
    result = run_cli("train", f"encoding={name}", *TINY, "trainer.max_steps=2",
                     "trainer.batch_size=2", "trainer.eval_batches=1", "check=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [run_dir] = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["kernels"]["layer_kinds"]["global"]["path"] == f"fused:{OPS[name]}"
    assert summary["kernels"]["fallbacks"] == [] and "flash-linear-attention" not in result.stderr


@interpreted
def test_posenc_check_compares_flas_kernel():
    """The fused-kernel row of `posenc check` runs fla's kernel (at 2 heads of 16: the subject's 4 heads of
    8 are below a GPU kernel's tile) in float32 against the hooks in float64, and says which it compared."""
    from posenc.check.kernel import NAME
    from posenc.check.results import Status
    from posenc.check.runner import run_checks
    from posenc.check.subject import compose_subject

    [row] = run_checks(compose_subject(["encoding=fox"]), only={"fused kernel"})
    assert row.name == NAME and row.status is Status.PASS, row
    assert row.measured.count("parallel_forgetting_attn in float32 through Triton's interpreter") == 2, row.measured
    assert "5 masks" in row.measured


def untransposed_beta(mask, *tensors):
    """``to_fla`` with a layout bug: PaTH's β (the last tensor) handed over in posenc's (B, H, T)."""
    out, offsets = TO_FLA(mask, *tensors)
    return [*out[:-1], tensors[-1]], offsets


def float_offsets(seg):
    """``cu_seqlens`` with a dtype bug: the offsets as floats."""
    return CU_SEQLENS(seg).float()


TO_FLA, CU_SEQLENS = fla_kernels.to_fla, fla_kernels.cu_seqlens


@interpreted
@pytest.mark.parametrize(("name", "bug", "error"), [
    ("path", ("to_fla", untransposed_beta), "AssertionError: beta should have the same number of heads as k"),
    ("fox", ("cu_seqlens", float_offsets), "not implemented for 'Float'"),
], ids=["layout: fla asserts", "dtype: torch raises inside fla"])
def test_an_adapter_bug_reaches_the_caller_not_a_fallback(name, bug, error, monkeypatch):
    """What fla asserts, or torch raises inside fla, about the arguments posenc's adapter passed is the
    adapter's bug: raised as it is, never a recorded fallback to the hooks with a warning blaming fla
    (``failures.refuses``: fla's refusals are its own RuntimeErrors and Triton's build errors)."""
    monkeypatch.setattr(fla_kernels, *bug)
    encoding = encoding_of(name, torch.float32)
    encoding.prepare(64)
    q, k, v, x = inputs(64, seed=3, dtype=torch.float32, batch=1)
    policy = kernels.KernelPolicy()
    ctx = context(64, segments_of(64, 5, batch=1), Window(), torch.float32)
    [chosen] = attention.plans(encoding, ctx, 1, 0.0, policy)
    assert isinstance(chosen, attention.FusedPlan)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(Exception) as raised:
            attention.attend_layer(q, k, v, encoding, ctx.with_input(x), 0, chosen)
    assert error in f"{type(raised.value).__name__}: {raised.value}"
    assert not chosen.failed and policy.fallbacks == [] and not policy.fused_is_refused(chosen.kind)
    assert not any("flash-linear-attention" in str(w.message) for w in said)


@interpreted
@pytest.mark.parametrize("layout", ["qwen3_next", "kimi_linear"])
def test_flas_recurrences_do_not_run_in_the_interpreter_and_say_so(layout, tmp_path):
    """fla 0.6's chunked kernels fail in Triton's interpreter (a kernel's loop counter is a Python int
    there, and fla calls ``i_t.to(tl.int64)`` on it): the first use says so in one warning naming the
    error, and the recurrent layers run posenc's chunked recurrence, recorded as a fallback."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = run_cli("train", *TINY, "model.n_layer=2", f"layout={layout}", "trainer.max_steps=1", "check=false",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [run_dir] = run_dirs(tmp_path)
    [fallback] = json.loads((run_dir / "summary.json").read_text())["kernels"]["fallbacks"]
    assert fallback["took"] == "chunked" and fallback["left"].startswith("fla:chunk_")
    assert "InterpreterError" in fallback["reason"] and "object has no attribute 'to'" in fallback["reason"]
    [warning] = [str(w.message) for w in said if "flash-linear-attention's chunk_" in str(w.message)]
    assert fallback["reason"] in warning and "chunked PyTorch recurrence" in warning
