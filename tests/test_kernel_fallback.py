"""A kernel that fails to compile never kills a run (issue 43): FlexAttention steps down a ladder of
kernel configurations derived from the device's shared memory and the head dim, then falls back to
the dense path, and a compiled model whose compilation fails trains uncompiled, each with one
warning naming the error.

The failures are injected, as a GPU produced them (the errors' texts are the ones an H200 printed),
so every fallback runs on a CPU: FlexAttention is chosen on the CPU by stubbing the kernel choice,
and the compilation that fails is stubbed where torch raises it.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import posenc.cli.app  # noqa: F401 - installs the CLI's warning format before a test records warnings
from conftest import TINY, run_cli, run_dirs
from posenc import errors
from posenc.errors import PosencWarning
from posenc.nn import attention, flex, flex_kernels
from posenc.nn.flex_kernels import CONFIGS, DENSE, KernelKey

#: what inductor raised for T5 at head_dim 64 on an H200 with torch's default kernel configuration
SHARED_MEMORY_ERROR = ("No valid triton configs. OutOfMemoryError: out of resource: "
                       "triton_tem_fused__unsafe_view_flex_attention_split_transpose_view_2 Required: 245760 "
                       "Hardware limit: 232448")
H100_SHARED_MEMORY = 232448  # bytes per block (sm_90's opt-in maximum)


def inductor_error(text: str) -> Exception:
    from torch._inductor.exc import InductorError

    return InductorError(RuntimeError(text), None)


#: dynamo's recompile-limit settings (named recompile_limit since torch 2.6, cache_size_limit before)
LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


@pytest.fixture(autouse=True)
def fresh_kernel_state(monkeypatch: pytest.MonkeyPatch):
    """Each test starts with no layer kind stepped down and no warning said, and leaves dynamo's
    recompile limit as it found it (posenc raises it where it compiles a model)."""
    monkeypatch.setattr(flex_kernels, "_LEVEL", {})
    monkeypatch.setattr(flex_kernels, "_FAILURE", {})
    monkeypatch.setattr(flex_kernels, "_PENDING", {})
    monkeypatch.setattr(errors, "_WARNED", set())
    config = torch._dynamo.config
    with config.patch({LIMIT: getattr(config, LIMIT),
                       "fail_on_recompile_limit_hit": getattr(config, "fail_on_recompile_limit_hit", False)}):
        yield


def flex_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan FlexAttention on the CPU, as attention plans it on CUDA."""
    monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("flex", None))


def posenc_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, PosencWarning)]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_the_ladder_starts_with_torchs_choice_and_keeps_what_fits_the_shared_memory(head_dim, itemsize):
    steps = flex_kernels.ladder(head_dim, itemsize, H100_SHARED_MEMORY)
    assert steps[0] is None  # torch's own configuration first: the fastest where it compiles
    for options in steps[1:]:
        assert options["num_stages"] <= 2 and 128 % options["BLOCK_M"] == 0 and 128 % options["BLOCK_N"] == 0
        config = (options["BLOCK_M"], options["BLOCK_N"], options["num_stages"], options["num_warps"])
        assert flex_kernels.fits(config, head_dim, itemsize, H100_SHARED_MEMORY)
    # what T5 needed on sm_90 (num_stages=2) is the first step down at the shapes users train
    assert steps[1]["num_stages"] == 2
    # shared memory used shrinks step by step
    need = [head_dim * itemsize * (o["BLOCK_M"] + 2 * o["num_stages"] * o["BLOCK_N"]) for o in steps[1:]]
    assert need == sorted(need, reverse=True)


def test_a_small_shared_memory_skips_the_configurations_that_cannot_fit():
    budget = 64 * 2 * (32 + 2 * 32)  # exactly the smallest configuration at head_dim 64 in bf16
    assert flex_kernels.ladder(64, 2, budget)[1:] == flex_kernels.ladder(64, 2, budget)[-1:]
    assert len(flex_kernels.ladder(64, 2, budget)) == 2
    assert len(flex_kernels.ladder(64, 2, 10**9)) == len(CONFIGS) + 1


def test_a_layer_kind_steps_down_to_the_dense_path_and_says_so_once():
    key = KernelKey("encoding 't5_bias' (T5Bias)", 64, "bfloat16")
    cpu = torch.device("cpu")
    seen = [flex_kernels.options(key, cpu)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        while seen[-1] != DENSE:
            seen.append(flex_kernels.step_down(key, inductor_error(SHARED_MEMORY_ERROR), cpu))
    assert seen[0] is None and seen[1:-1] == flex_kernels.ladder(64, 2, flex_kernels.DEFAULT_SHARED_MEMORY)[1:]
    [said] = posenc_warnings(record)
    assert "t5_bias" in said and "head_dim 64" in said and "out of resource" in said and "SDPA" in said
    assert "out of resource" in flex_kernels.failure(key)


def test_a_configuration_that_compiles_after_a_failure_is_named_in_one_warning():
    key = KernelKey("encoding 't5_bias' (T5Bias)", 64, "bfloat16")
    cpu = torch.device("cpu")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        flex_kernels.step_down(key, inductor_error(SHARED_MEMORY_ERROR), cpu)
        flex_kernels.settled({key}, cpu)
        flex_kernels.settled({key}, cpu)  # said once
    [said] = posenc_warnings(record)
    assert "did not compile with torch's default configuration" in said and "'num_stages': 2" in said


def test_a_forward_whose_flex_kernels_never_compile_equals_the_dense_path(monkeypatch):
    """Eager FlexAttention (evaluation, `posenc check`): every configuration fails to compile, the
    layer kind falls back to SDPA with an explicit mask in the same forward, with the dense path's
    logits, and says so once."""
    from posenc.build import build_model
    from posenc.config import compose

    torch.manual_seed(0)
    model = build_model(compose(["encoding=t5_bias", "model.n_layer=2", "model.n_head=2", "model.d_model=32",
                                 "trainer.seq_len=64"]), vocab_size=64)
    for p in model.encoding.parameters():
        torch.nn.init.normal_(p, std=0.5)
    idx = torch.randint(64, (2, 64), generator=torch.Generator().manual_seed(0))
    expected, _ = model(idx)  # the CPU's dense path
    tried = []

    def fails(*args, **kwargs):
        tried.append(kwargs.get("kernel_options"))
        raise inductor_error(SHARED_MEMORY_ERROR)

    flex_on_the_cpu(monkeypatch)
    monkeypatch.setattr(flex, "compiled_flex_attention", lambda: fails)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logits, _ = model(idx)
        again, _ = model(idx)  # the next forward plans the dense path directly, silently
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(again, expected)
    assert tried == flex_kernels.ladder(16, 4, flex_kernels.DEFAULT_SHARED_MEMORY)  # every step once, in order
    [said] = posenc_warnings(record)
    assert "t5_bias" in said and "SDPA with an explicit mask" in said


def test_a_run_whose_flex_kernels_never_compile_finishes_with_one_warning(workdir, monkeypatch, recwarn):
    """`posenc train` with FlexAttention failing to compile at every configuration, forwards and
    backwards: the run completes on the dense path, with one warning naming the error."""
    flex_on_the_cpu(monkeypatch)

    def fails(*args, **kwargs):
        raise inductor_error(SHARED_MEMORY_ERROR)

    monkeypatch.setattr(flex, "compiled_flex_attention", lambda: fails)
    result = run_cli("train", *TINY, "encoding=alibi", "eval.at_end=true", "eval.lengths=[1,2]", cwd=workdir)
    assert result.returncode == 0, result.stderr
    [run_dir] = run_dirs(workdir)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    [said] = [w for w in posenc_warnings(list(recwarn)) if "did not compile" in w]
    assert "alibi" in said and "out of resource" in said


class CompiledStub(torch.nn.Module):
    """What torch.compile returns (the module it wraps as ``_orig_mod``), raising what a failed
    compilation raises at the call: ``error(module)`` says which, or None once it would compile."""

    def __init__(self, module: torch.nn.Module, error) -> None:
        super().__init__()
        self._orig_mod = module
        self.error = error
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        out = self._orig_mod(*args, **kwargs)  # plans (and registers its FlexAttention kernels) as a trace would
        failure = self.error(self)
        if failure is not None:
            raise failure
        return out


def compiled_state(monkeypatch: pytest.MonkeyPatch, encoding: str, error):
    """A TrainState whose step model is a CompiledStub around a tiny model."""
    from posenc.build import build_model
    from posenc.config import compose
    from posenc.data.batches import Batch
    from posenc.train import state as state_module

    monkeypatch.setattr(state_module, "use_compile", lambda setting, device: True)
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: CompiledStub(module, error))
    cfg = compose([f"encoding={encoding}", *TINY, "trainer.compile=true"])
    model = build_model(cfg, vocab_size=64)
    idx = torch.randint(64, (4, 33), generator=torch.Generator().manual_seed(0))
    batch = Batch(idx[:, :-1], idx[:, 1:])

    class Same:
        def next(self) -> Batch:
            return batch

    from contextlib import nullcontext

    return state_module.new_train_state(model, cfg.trainer, Same(), torch.device("cpu"), nullcontext)


def test_a_compiled_step_whose_flex_kernel_fails_steps_down_and_ends_on_the_dense_path(monkeypatch):
    """The outer compile raises the FlexAttention kernel's error at the step: each attempt steps
    the layer kinds it planned down their ladder, and the step is taken again, from the same
    micro-batches with no gradient kept, until it runs (here: on the dense path)."""
    from posenc.train.state import micro_batches, train_step

    flex_on_the_cpu(monkeypatch)
    # planned with FlexAttention, the stub's compilation fails; on the dense path it compiles
    state = compiled_state(monkeypatch, "alibi", lambda stub: inductor_error(SHARED_MEMORY_ERROR)
                           if flex_kernels.active else None)
    monkeypatch.setattr(flex.FlexPlan, "attend", lambda self, q, k, v, decay=None, sink=None:
                        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = train_step(state, micro_batches(state))
        train_step(state, micro_batches(state))
    assert state.step == 2 and state.tokens == 2 * 4 * 32 and torch.isfinite(result.loss)
    assert state.step_model.calls == len(flex_kernels.ladder(16, 4, flex_kernels.DEFAULT_SHARED_MEMORY)) + 2
    assert hasattr(state.step_model, "_orig_mod")  # still compiled: only the layer kind fell back
    [said] = posenc_warnings(record)
    assert "alibi" in said and "SDPA with an explicit mask" in said


def test_a_compiled_model_whose_compilation_fails_elsewhere_trains_uncompiled(monkeypatch):
    """A compile error that is not FlexAttention's (inductor's cumulative-sum codegen on an H200):
    the model runs uncompiled from that step on, with one warning naming the error."""
    from posenc.train.state import micro_batches, train_step

    scan_error = "TypeError: list indices must be integers or slices, not NoneType"
    state = compiled_state(monkeypatch, "rope", lambda stub: inductor_error(scan_error))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = train_step(state, micro_batches(state))
    assert not hasattr(state.step_model, "_orig_mod") and state.step == 1 and torch.isfinite(result.loss)
    [said] = posenc_warnings(record)
    assert "torch.compile failed" in said and "list indices must be integers" in said and "uncompiled" in said


def test_an_error_that_is_no_failed_compilation_is_not_swallowed(monkeypatch):
    from posenc.train.state import micro_batches, train_step

    state = compiled_state(monkeypatch, "rope", lambda stub: ValueError("a bug in a hook"))
    with pytest.raises(ValueError, match="a bug in a hook"):
        train_step(state, micro_batches(state))
    assert state.step == 0 and hasattr(state.step_model, "_orig_mod")


def test_reaching_dynamos_recompile_limit_raises_it_and_says_so(monkeypatch):
    """Many models or score_mods in one process: reaching the limit is an error posenc catches and
    answers by raising the limit (never a silent fall to uncompiled FlexAttention)."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    from posenc.train.state import micro_batches, train_step

    config, name = torch._dynamo.config, LIMIT
    setattr(config, name, 8)  # torch's default (the fixture restores what was set)
    hits = iter([FailOnRecompileLimitHit("Hard failure due to fail_on_recompile_limit_hit")])
    state = compiled_state(monkeypatch, "rope", lambda stub: next(hits, None))
    assert getattr(config, name) == flex_kernels.RECOMPILE_LIMIT  # raised where posenc compiles a model
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        train_step(state, micro_batches(state))
    assert getattr(config, name) == 2 * flex_kernels.RECOMPILE_LIMIT
    [said] = posenc_warnings(record)
    assert f"{name} raised to {2 * flex_kernels.RECOMPILE_LIMIT}" in said


def test_posencs_warnings_print_as_one_warning_line(capsys):
    """The CLI's format: `warning: <message>`, one line, on stderr; Python's own warnings unchanged."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        errors.show_as_lines()
        warnings.warn("FlexAttention for x did not compile", PosencWarning)
        with pytest.warns(UserWarning):
            warnings.warn("something of Python's", UserWarning)
    err = capsys.readouterr().err
    assert "warning: FlexAttention for x did not compile\n" in err
    assert "warning: something of Python's" not in err  # Python's own go where Python sends them
