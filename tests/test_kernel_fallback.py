"""A kernel that fails to compile never kills a run, and the run says how it ran.

FlexAttention steps down a ladder of kernel configurations derived from the device's shared memory
and the head dim, then to the dense path; a compiled model whose compilation fails outside attention
trains uncompiled; each is recorded in the run's kernel policy (the layer kind, the paths, the
reason, the step) and said in one warning per run.

The failures come from a real ``torch.compile``: dynamo backends that raise the errors an H200
printed, at compile time or when the compiled code runs, forward or backward (tests/compile_failures.py),
on a real model with FlexAttention planned on the CPU as on CUDA.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import pytest
import torch
from compile_failures import SCAN_ERROR, SEEN, SHARED_MEMORY_ERROR, flex_on_the_cpu
from conftest import TINY

import posenc.cli.app  # noqa: F401 - installs the CLI's warning format before a test records warnings
from posenc import errors
from posenc.errors import PosencWarning
from posenc.nn import failures, kernels, torch_private
from posenc.nn.kernels import CONFIGS, DENSE, Action, Decision, KernelKey, KernelPolicy

H100_SHARED_MEMORY = 232448  # bytes per block (sm_90's opt-in maximum)
#: a device whose shared memory holds only the smallest configuration at head_dim 16 in float32: a
#: ladder of two rungs (torch's choice, then that one), so a test walks it in two compilations
ONE_RUNG = 16 * 4 * (32 + 2 * 32)
LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    """No warning said; dynamo's recompile limit and the graphs the test backends saw restored after
    the test."""
    monkeypatch.setattr(errors, "_WARNED", set())
    SEEN.clear()
    config = torch._dynamo.config
    with config.patch({LIMIT: getattr(config, LIMIT),
                       "fail_on_recompile_limit_hit": getattr(config, "fail_on_recompile_limit_hit", False)}):
        yield


def failing(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """FlexAttention on the CPU, compiled by the test backend ``backend`` (tests/compile_failures.py),
    on a device with room for one smaller configuration."""
    flex_on_the_cpu(monkeypatch)
    monkeypatch.setenv(kernels.BACKEND_VARIABLE, f"compile_failures:{backend}")
    monkeypatch.setattr(kernels, "DEFAULT_SHARED_MEMORY", ONE_RUNG)


def posenc_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, PosencWarning)]


# --- the ladder ------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_the_ladder_starts_with_torchs_choice_and_keeps_what_fits_the_shared_memory(head_dim, itemsize):
    steps = kernels.ladder(head_dim, itemsize, H100_SHARED_MEMORY)
    assert steps[0] is None  # torch's own configuration first: the fastest where it compiles
    for options in steps[1:]:
        assert options["num_stages"] <= 2 and 128 % options["BLOCK_M"] == 0 and 128 % options["BLOCK_N"] == 0
        config = (options["BLOCK_M"], options["BLOCK_N"], options["num_stages"], options["num_warps"])
        assert kernels.fits(config, head_dim, itemsize, H100_SHARED_MEMORY)
    # what T5 needed on sm_90 (num_stages=2) is the first step down at the shapes users train
    assert steps[1]["num_stages"] == 2
    need = [head_dim * itemsize * (o["BLOCK_M"] + 2 * o["num_stages"] * o["BLOCK_N"]) for o in steps[1:]]
    assert need == sorted(need, reverse=True)  # shared memory used shrinks step by step


def test_a_small_shared_memory_skips_the_configurations_that_cannot_fit():
    budget = 64 * 2 * (32 + 2 * 32)  # exactly the smallest configuration at head_dim 64 in bf16
    assert kernels.ladder(64, 2, budget)[1:] == kernels.ladder(64, 2, budget)[-1:]
    assert len(kernels.ladder(64, 2, budget)) == 2
    assert len(kernels.ladder(64, 2, 10**9)) == len(CONFIGS) + 1


def step_down(key: KernelKey, reason: str) -> Decision:
    """What the policy decides when key's kernel failed to compile in an eager FlexAttention call."""
    return Decision(Action.RETAKE, reason, flex=(key,))


def test_a_layer_kind_steps_down_to_the_dense_path_records_it_and_says_so_once():
    policy = KernelPolicy()
    key = KernelKey("global", "encoding 't5_bias' (T5Bias)", 64, "bfloat16")
    seen = [policy.flex_options(key)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        while seen[-1] != DENSE:
            policy.apply(step_down(key, f"InductorError: {SHARED_MEMORY_ERROR}"))
            seen.append(policy.flex_options(key))
    policy.stamp(0, 3)  # the training step they happened in
    assert seen[0] is None and seen[1:-1] == kernels.ladder(64, 2, kernels.DEFAULT_SHARED_MEMORY)[1:]
    [said] = posenc_warnings(record)
    assert "t5_bias" in said and "head_dim 64" in said and "out of resource" in said and "SDPA" in said
    [fallback] = policy.record()["fallbacks"]
    assert fallback["layer_kind"] == "global" and (fallback["left"], fallback["took"], fallback["step"]) == ("flex", "dense", 3)
    assert "out of resource" in policy.flex_failure(key)


def test_a_configuration_that_compiles_after_a_failure_is_recorded_and_named_in_one_warning():
    policy = KernelPolicy()
    key = KernelKey("global", "encoding 't5_bias' (T5Bias)", 64, "bfloat16")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        policy.apply(step_down(key, SHARED_MEMORY_ERROR))
        policy.settled({key})
        policy.settled({key})  # said once
    [said] = posenc_warnings(record)
    assert "did not compile with torch's default configuration" in said and "'num_stages': 2" in said
    [fallback] = policy.fallbacks
    assert fallback.left == "flex" and fallback.took.startswith("flex #1 (BLOCK_M=128 BLOCK_N=64 stages=2")


def test_each_run_says_its_warning_again():
    """A sweep's jobs and a bench's models share a process: each run's policy says its own warnings."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")  # Python's own filter: once per location, unless told otherwise
        for _ in range(2):
            run = KernelPolicy()
            run.say("FlexAttention for x did not compile")
            run.say("FlexAttention for x did not compile")
    assert posenc_warnings(record) == ["FlexAttention for x did not compile"] * 2


# --- what a failure is: real errors of a real torch.compile ----------------------------------------
def test_the_classifier_tells_a_failed_compilation_from_a_bug_and_a_recompile_limit(monkeypatch):
    """A backend's failure to build (inductor's errors: BackendCompilerFailed around them) is a
    compilation to step around; a wrong backward formula that AOTAutograd wraps in the same
    BackendCompilerFailed is a bug (re-raised, never trained around); dynamo refusing to compile once
    more is its recompile limit."""
    from compile_failures import flex_at_compile

    x = torch.randn(4, 4, requires_grad=True)

    def compiled_error(fn, backend, *args) -> failures.Failure:
        torch._dynamo.reset()
        with pytest.raises(Exception) as caught:
            torch.compile(fn, backend=backend)(*args).sum().backward()
        return failures.classify(caught.value)

    @torch.library.custom_op("test50::double", mutates_args=())
    def double(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    double.register_fake(lambda t: t.new_empty(t.shape))
    double.register_autograd(lambda ctx, grad: grad.sum(0) * 2)  # a bug: the gradient's shape is wrong
    bug = compiled_error(lambda t: double(t) + 1, "aot_eager", x)
    assert bug.kind == failures.BUG and "invalid gradient" in bug.reason
    assert type(bug.error).__name__ == "BackendCompilerFailed"

    flex_on_the_cpu(monkeypatch)
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 1, 16, 16, requires_grad=True)
    compile_failure = compiled_error(lambda q: flex_attention(q, q, q), flex_at_compile, q)
    assert compile_failure.kind == failures.COMPILE and compile_failure.flex
    assert compile_failure.reason == f"NoTritonConfigsError: {SHARED_MEMORY_ERROR}"

    torch._dynamo.reset()
    with torch._dynamo.config.patch({LIMIT: 1, "fail_on_recompile_limit_hit": True}):
        f = torch.compile(lambda t: t * 2, backend="eager", dynamic=False)
        f(torch.ones(2))
        with pytest.raises(Exception) as caught:
            f(torch.ones(3))
    assert failures.classify(caught.value).kind == failures.RECOMPILE_LIMIT
    assert failures.classify(ValueError("a bug in a hook")).kind == failures.BUG


# --- an eager forward ---------------------------------------------------------------------------------
def test_a_forward_whose_flex_kernels_never_compile_equals_the_dense_path(monkeypatch):
    """Eager FlexAttention (evaluation): every configuration fails to compile, the layer kind falls
    back to SDPA with an explicit mask in the same forward, with the dense path's logits, recorded and
    said once."""
    from posenc.build import build_model
    from posenc.config import compose

    torch.manual_seed(0)
    model = build_model(compose(["encoding=t5_bias", "model.n_layer=2", "model.n_head=2", "model.d_model=32",
                                 "trainer.seq_len=64"]), vocab_size=64)
    for p in model.encoding.parameters():
        torch.nn.init.normal_(p, std=0.5)
    idx = torch.randint(64, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, _ = model(idx)  # the CPU's dense path
        failing(monkeypatch, "flex_at_compile")
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            logits, _ = model(idx)
            again, _ = model(idx)  # the next forward plans the dense path directly, silently
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(again, expected)
    assert SEEN == [("dynamo", True)] * 2  # each rung once, in order, then no more compilation
    [said] = posenc_warnings(record)
    assert "t5_bias" in said and "SDPA with an explicit mask" in said
    record = model.kernels.record()
    assert record["layer_kinds"]["global"]["path"] == "dense" and record["fallbacks"][0]["step"] is None


# --- a compiled training step --------------------------------------------------------------------------
def compiled_state(encoding: str):
    """A TrainState whose step model is torch.compile's (with the backend POSENC_COMPILE_BACKEND names)
    around a tiny model, fed one fixed batch."""
    from posenc.build import build_model
    from posenc.config import compose
    from posenc.data.batches import Batch
    from posenc.train.state import new_train_state

    cfg = compose([f"encoding={encoding}", *TINY, "trainer.compile=true"])
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=64)
    idx = torch.randint(64, (4, 33), generator=torch.Generator().manual_seed(0))
    batch = Batch(idx[:, :-1], idx[:, 1:])

    class Same:
        def next(self) -> Batch:
            return batch

    return new_train_state(model, cfg.trainer, Same(), torch.device("cpu"), nullcontext)


@pytest.mark.parametrize("backend", ["flex_forward_at_run", "flex_backward_at_run"])
def test_a_compiled_step_whose_flex_kernel_fails_when_run_steps_that_layer_kind_down(backend, monkeypatch):
    """The compiled model's FlexAttention kernel compiles and fails when it first runs, in its forward
    (then the failing forward's own record of what it planned is lost) or its backward: the step is
    taken again from the same micro-batches with no gradient kept, the attention layer kind stepping
    down its ladder to the dense path, while the model stays compiled; the record names the layer kind,
    its path and the step."""
    from posenc.train.state import micro_batches, train_step

    failing(monkeypatch, backend)
    state = compiled_state("t5_bias")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = train_step(state, micro_batches(state))
        train_step(state, micro_batches(state))
    assert state.step == 2 and state.tokens == 2 * 4 * 32 and torch.isfinite(result.loss)
    assert hasattr(state.step_model, "_orig_mod")  # still compiled: only the layer kind fell back
    failed = [i for i, (_, flex) in enumerate(SEEN) if flex]
    assert failed and all(not flex for _, flex in SEEN[failed[-1] + 1:])  # then compiled, without it
    assert {stage for stage, _ in SEEN[failed[-1] + 1:]} == {"fw", "bw"}
    [said] = posenc_warnings(record)
    assert "t5_bias" in said and "SDPA with an explicit mask" in said
    record = state.kernels.record()
    assert record["compiled"] and record["layer_kinds"]["global"]["path"] == "dense"
    [fallback] = record["fallbacks"]
    assert (fallback["layer_kind"], fallback["encoding"], fallback["left"], fallback["took"], fallback["step"]) == \
        ("global", "t5_bias", "flex", "dense", 1)
    assert fallback["reason"] == f"NoTritonConfigsError: {SHARED_MEMORY_ERROR}"


def test_a_compiled_model_whose_compilation_fails_elsewhere_trains_uncompiled(monkeypatch):
    """A compile error outside attention (inductor's cumulative-sum codegen on an H200): the model runs
    uncompiled from that step on, recorded, with one warning naming the error."""
    from posenc.train.state import micro_batches, train_step

    monkeypatch.setenv(kernels.BACKEND_VARIABLE, "compile_failures:elsewhere")
    state = compiled_state("rope")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = train_step(state, micro_batches(state))
    assert not hasattr(state.step_model, "_orig_mod") and state.step == 1 and torch.isfinite(result.loss)
    [said] = posenc_warnings(record)
    assert "torch.compile failed" in said and SCAN_ERROR in said and "uncompiled" in said
    record = state.kernels.record()
    assert not record["compiled"] and record["compile_asked"]
    assert [(f["layer_kind"], f["took"], f["step"]) for f in record["fallbacks"]] == [("model", "uncompiled", 1)]


def test_an_error_that_is_no_failed_compilation_is_not_swallowed(monkeypatch):
    from posenc.train.state import micro_batches, train_step

    def a_bug(gm, inputs):
        raise ValueError("a bug in a hook")

    import compile_failures

    monkeypatch.setattr(compile_failures, "a_bug", a_bug, raising=False)
    monkeypatch.setenv(kernels.BACKEND_VARIABLE, "compile_failures:a_bug")
    state = compiled_state("rope")
    with pytest.raises(Exception, match="a bug in a hook"):
        train_step(state, micro_batches(state))
    assert state.step == 0 and hasattr(state.step_model, "_orig_mod") and not state.kernels.fallbacks


def test_reaching_dynamos_recompile_limit_raises_it_and_says_so(monkeypatch):
    """Many models or shapes in one process: reaching the run's recompile limit is an error posenc
    catches and answers by raising the run's limit (never a silent fall to uncompiled code); dynamo's
    config is the process's again outside the run's compilations."""
    from posenc.data.batches import Batch
    from posenc.train.state import micro_batches, train_step

    monkeypatch.setenv(kernels.BACKEND_VARIABLE, "eager")
    process = (torch_private.recompile_limit(), getattr(torch._dynamo.config, "fail_on_recompile_limit_hit", None))
    state = compiled_state("rope")
    assert state.kernels.recompile_limit >= kernels.RECOMPILE_LIMIT  # where posenc compiles
    train_step(state, micro_batches(state))
    state.kernels.recompile_limit = 1  # this run has compiled its one graph: the next shape is past its limit
    idx = torch.randint(64, (4, 17), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        train_step(state, [Batch(idx[:, :-1], idx[:, 1:])])  # another length: dynamo compiles again
    assert state.kernels.recompile_limit >= 2 and state.step == 2 and state.kernels.compiled
    said = posenc_warnings(record)  # once per doubling
    assert said and all(f"{LIMIT} raised to" in line for line in said)
    assert state.kernels.record()["recompile_limit"] == state.kernels.recompile_limit
    assert (torch_private.recompile_limit(), getattr(torch._dynamo.config, "fail_on_recompile_limit_hit", None)) \
        == process  # the process's config as it was


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


@pytest.mark.parametrize("change", ["flex step down", "fused refused", "fla refused", "fla passed"])
def test_a_compiled_forward_sees_every_change_of_the_policy_it_read(change):
    """What plan() and a recurrent layer ask the policy inside a compiled trace (with a key the trace
    itself built) is guarded: after a step down, a refusal or fla's first use the next call is traced
    again and takes the new answer, on every torch of the range (torch 2.7 did not guard a dict looked
    up with such a key, and reran the graph that had failed)."""
    policy, graphs = KernelPolicy(), []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=counting, fullgraph=True)
    def forward(x: torch.Tensor) -> torch.Tensor:
        key = KernelKey("global", "encoding 't5_bias' (T5Bias)", 16, "float32")  # built in the trace, as plan() does
        if change == "flex step down":
            return x + 1 if policy.flex_options(key) is None else x - 1
        if change == "fused refused":
            return x - 1 if policy.fused_is_refused("global") else x + 1
        if change == "fla passed":
            return x - 1 if policy.fla_kernel("gated_delta", "cpu", torch.float32, 16, 16) is not None else x + 1
        return x - 1 if policy.fla_is_refused("gated_delta") else x + 1

    x = torch.zeros(3)
    assert torch.equal(forward(x), x + 1) and len(graphs) == 1
    with warnings.catch_warnings():  # each change says itself once: not what is tested here
        warnings.simplefilter("ignore", PosencWarning)
        if change == "flex step down":
            policy.apply(step_down(KernelKey("global", "encoding 't5_bias' (T5Bias)", 16, "float32"), "no configs"))
        elif change == "fused refused":
            policy.apply(Decision(Action.RETAKE, "refused", fused=(("global", "parallel_forgetting_attn"),)))
        elif change == "fla passed":
            policy.fla_usable("gated_delta", "cpu", torch.float32, 16, 16, torch.add)
        else:
            policy.apply(Decision(Action.RETAKE, "refused", recurrent=(("gated_delta", "chunk_gated_delta_rule"),)))
    assert torch.equal(forward(x), x - 1) and len(graphs) == 2
