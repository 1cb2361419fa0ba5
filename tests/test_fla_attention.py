"""flash-linear-attention's kernels for FoX, PaTH, PaTH-FoX and stick-breaking: on a CUDA
context the plan is fla's kernel, offered by the encoding's ``fused_attention`` hook; fla absent or
refusing (at import, or when the kernel runs) is one warning and posenc's own path; and the
arguments posenc passes (FoX's gates in log space and unscaled, PaTH's w and β, its gates times √d,
stick-breaking's remainder on the query's own value, documents and chunked windows as cu_seqlens, a
sliding window as window_size) make fla's maths posenc's definition.

On CPU the adapters run with fla's naive references (fla/ops/<op>/naive.py, loaded by file, run
document by document where fla's kernel takes cu_seqlens) in place of the Triton ops, through the
very kernel the encoding offers on CUDA (the device stubbed, as test_attention_paths.py does), in
float64 against posenc's own path, values and gradients of q, k, v and every parameter of the
encoding. On a GPU the same tests run fla's Triton kernels (marked cuda, skipped without CUDA); on a
CPU, tests/test_fla_interpreter.py runs them under Triton's interpreter.
"""

from __future__ import annotations

import functools
import itertools
import types
import warnings

import pytest
import torch
from fla_cases import FUSED, assert_close, context, encoding_of, inputs, layer_and_grads, segments_of
from fla_reference import fla_naive

from posenc import errors
from posenc.config import compose
from posenc.nn import attention
from posenc.nn import fla_kernels
from posenc.nn.kernels import KernelPolicy
from posenc.nn.encodings.base import Context
from posenc.nn.mask import Window

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# --- fla's naive references with the Triton ops' signatures -------------------------------------
def per_document(naive, outputs: int = 1):
    """naive as fla's op takes documents: each cu_seqlens segment of the flattened sequence run alone."""
    @functools.wraps(naive)  # its signature: what posenc reads of the op (a window_size, or none)
    def op(q, k, v, *per_token, cu_seqlens=None, **options):
        if cu_seqlens is None:
            return naive(q, k, v, *per_token, **options)
        bounds = cu_seqlens.tolist()
        runs = [naive(q[:, a:b], k[:, a:b], v[:, a:b], *(None if t is None else t[:, a:b] for t in per_token),
                      **options) for a, b in itertools.pairwise(bounds)]
        if outputs == 1:
            return torch.cat(runs, dim=1)
        return tuple(None if parts[0] is None else torch.cat(parts, dim=1) for parts in zip(*runs))

    return op


def naive_ops() -> dict[str, tuple]:
    forgetting = fla_naive("forgetting_attn/naive.py").naive_forgetting_attn
    path = fla_naive("path_attn/naive.py").naive_path_attn
    stick = fla_naive("stickbreaking_attn/naive.py").naive_stickbreaking_attn

    def path_op(q, k, v, w, beta, g, scale):  # fla's op returns (o, k_cache); its naive needs the gates
        return path(q, k, v, w, beta, torch.zeros_like(beta) if g is None else g, scale), None

    def forgetting_op(q, k, v, g, scale, window_size=None):  # fla's op returns q's dtype, its naive float32
        return forgetting(q, k, v, g, scale, window_size).to(q.dtype)

    return {fla_kernels.FORGETTING[0]: (per_document(forgetting_op),),
            fla_kernels.PATH[0]: (per_document(path_op, outputs=2),),
            fla_kernels.STICK_BREAKING[0]: (per_document(stick, outputs=2),)}


@pytest.fixture
def fresh(monkeypatch):
    """No warning said yet in this process."""
    monkeypatch.setattr(errors, "_WARNED", set())


@pytest.fixture
def on_cuda(monkeypatch, fresh):
    """stub(naive=True): from then on contexts are on CUDA (the device stubbed; the hooks' own path
    there is the explicit-mask one, which runs on the CPU), in any dtype the naive references take,
    and fla's ops are its naive references unless naive=False."""
    def stub(naive: bool = True) -> None:
        if naive:
            ops = naive_ops()
            monkeypatch.setattr(fla_kernels, "load", lambda module, names: ops[module])
            monkeypatch.setattr(fla_kernels, "DTYPES", (*fla_kernels.DTYPES, torch.float64))
        monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("sdpa", None))
        monkeypatch.setattr(Context, "device", property(lambda self: torch.device("cuda")))
    return stub


# --- which plan ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("window", [Window(), Window(64, chunked=True)])
def test_on_cuda_the_plan_is_flas_kernel(name, window, on_cuda):
    encoding = encoding_of(name, torch.float32)
    doc = segments_of(256, 1)
    on_cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # taken silently
        assert isinstance(attention.plan(encoding, context(256, None, window, torch.bfloat16), 0, 0.0, KernelPolicy()),
                          attention.FusedPlan)
        assert isinstance(attention.plan(encoding, context(256, doc, window, torch.float32), 1, 0.0, KernelPolicy()),
                          attention.FusedPlan)


@pytest.mark.parametrize(("name", "why"), [
    ("path", "takes no sliding window"), ("stick_breaking", "takes no sliding window"),
    ("fox", "no attention dropout"), ("fox", "float16, bfloat16 or float32"), ("path", "takes head_dim 16, 32"),
])
def test_what_flas_kernel_does_not_take_falls_back_with_one_warning(name, why, on_cuda, monkeypatch):
    encoding = encoding_of(name, torch.float32)
    window = Window(100) if "sliding" in why else Window()
    dropout = 0.1 if "dropout" in why else 0.0
    dtype = torch.float64 if "float16" in why else torch.bfloat16
    if "head_dim" in why:
        monkeypatch.setattr(encoding, "head_dim", 48)
    on_cuda()
    monkeypatch.setattr(fla_kernels, "DTYPES", (torch.float16, torch.bfloat16, torch.float32))
    policy = KernelPolicy()  # one run's plans
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        plans = [attention.plan(encoding, context(256, None, window, dtype), 0, dropout, policy) for _ in range(2)]
    assert not any(isinstance(p, attention.FusedPlan) for p in plans)
    [message] = [str(w.message) for w in said if why in str(w.message)]  # said once, naming the encoding
    assert f"encoding '{name}'" in message
    if "dropout" not in why:  # what the kernel does not take is the run's fallback from it, recorded
        [fallback] = policy.fallbacks
        assert fallback.left.startswith("fused:parallel_") and fallback.took == "hooks" and why in fallback.reason


HOPPER = "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results"


def in_fla(source: str) -> dict:
    """source's definitions, as if written in fla's package (its file is fla's forgetting attention):
    what fla raises there is fla's own (``failures.refuses``)."""
    namespace: dict = {}
    exec(compile(source, "/site-packages/fla/ops/forgetting_attn/parallel.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("failure", [ImportError("No module named 'fla'"), RuntimeError(HOPPER)])
def test_without_fla_or_when_it_refuses_at_import_the_plan_is_posencs_own_with_one_warning(name, failure, on_cuda,
                                                                                         monkeypatch):
    def import_fla(module):
        raise failure
    monkeypatch.setattr(fla_kernels, "import_fla", import_fla)
    encoding, policy = encoding_of(name, torch.float32), KernelPolicy()
    on_cuda(naive=False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        plans = [attention.plan(encoding, context(256, None, Window(), torch.bfloat16), layer, 0.0, policy)
                 for layer in (0, 1)]
    assert not any(isinstance(p, attention.FusedPlan) for p in plans)
    [fla] = [str(w.message) for w in said if "flash-linear-attention" in str(w.message)]
    assert f"{type(failure).__name__}: {failure}" in fla


@pytest.mark.parametrize("name", FUSED)
def test_a_kernel_that_refuses_when_it_runs_leaves_the_layer_to_posencs_path(name, on_cuda, monkeypatch):
    """fla refusing when its kernel runs (a RuntimeError fla raises) is one warning; that layer, and the
    next forward's plan, are posenc's own path, with the same output."""
    refusing = in_fla(f"def refusing(*args, **kwargs):\n    raise RuntimeError({HOPPER!r})\n")["refusing"]
    fla = types.SimpleNamespace(parallel_forgetting_attn=refusing, parallel_path_attn=refusing,
                                parallel_stickbreaking_attn=refusing)
    monkeypatch.setattr(fla_kernels, "import_fla", lambda module: fla)
    encoding = encoding_of(name)
    encoding.prepare(128)
    q, k, v, x = inputs(128, seed=3)
    cpu = context(128, None, Window(), torch.float64)
    expected = attention.attend_layer(q, k, v, encoding, cpu.with_input(x), 0,
                                      attention.plan(encoding, cpu, 0, 0.0, KernelPolicy()))
    on_cuda(naive=False)
    monkeypatch.setattr(fla_kernels, "DTYPES", (torch.float64,))
    ctx = context(128, None, Window(), torch.float64)
    policy = KernelPolicy()
    chosen = attention.plan(encoding, ctx, 0, 0.0, policy)
    assert isinstance(chosen, attention.FusedPlan)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = attention.attend_layer(q, k, v, encoding, ctx.with_input(x), 0, chosen)
        later = attention.plan(encoding, ctx, 0, 0.0, policy)
    [fla] = [str(w.message) for w in said if "flash-linear-attention" in str(w.message)]
    assert f"RuntimeError: {HOPPER}" in fla and not isinstance(later, attention.FusedPlan)
    torch.testing.assert_close(out, expected)


# --- parity: fla's maths through posenc's arguments = posenc's own path --------------------------------
MASKS = {"causal": (False, Window()), "documents": (True, Window()), "chunked": (True, Window(128, chunked=True)),
         "sliding": (True, Window(48))}
#: each kernel under each way posenc hands it a mask: none; documents (cu_seqlens); a chunked window (its
#: chunks as cu_seqlens segments, inside documents); a sliding window (fla's window_size, inside documents)
CASES = [("fox", "causal"), ("fox", "sliding"), ("fox_rope", "chunked"), ("path", "causal"), ("path_fox", "chunked"),
         ("stick_breaking", "causal"), ("stick_breaking", "documents"), ("stick_breaking", "chunked")]
#: fla's FoX and PaTH references compute in float32 inside (cumulative sums of the gates, products of
#: transforms): agreement to float32's precision, 1e-5 of the largest value (1e-6 measured); its
#: stick-breaking reference stays in float64 (1e-15 measured)
TOLERANCE = {"naive": {"fox": 1e-5, "fox_rope": 1e-5, "path": 1e-5, "path_fox": 1e-5, "stick_breaking": 1e-12},
             "triton": dict.fromkeys(FUSED, 5e-3)}


@pytest.mark.parametrize("backend", ["naive", pytest.param("triton", marks=[pytest.mark.cuda, cuda])])
@pytest.mark.parametrize(("name", "mask"), CASES)
def test_flas_kernel_computes_posencs_definition(name, mask, backend, on_cuda, monkeypatch):
    """Values and gradients (q, k, v, FoX's gates, PaTH's projections, convolution and β) of the layer
    by fla's kernel, fed what posenc feeds it, equal posenc's own path: float64 with fla's naive
    references (float32 on a GPU with fla's Triton kernels), head_dim 64, T = 320: five of the 64-token
    chunks of PaTH's algorithms (what its scores depend on; fla's naive PaTH takes ~20 s at T = 512)."""
    T = 320
    documents, window = MASKS[mask]
    doc = segments_of(T, 2) if documents else None
    device, dtype = ("cpu", torch.float64) if backend == "naive" else ("cuda", torch.float32)
    encoding = encoding_of(name, dtype, device)
    q, k, v, x = inputs(T, seed=4, dtype=dtype, device=device)
    with monkeypatch.context() as own:  # posenc's own path: the plan from the encoding's hooks
        own.setattr(attention, "fused_plan", lambda *args: None)
        _, expected, expected_grads = layer_and_grads(encoding, context(T, doc, window, dtype, device), q, k, v, x)
    if backend == "naive":
        on_cuda()
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
    chosen, out, grads = layer_and_grads(encoding, context(T, doc, window, dtype, device), q, k, v, x)
    assert isinstance(chosen, attention.FusedPlan) and not chosen.failed
    tolerance = TOLERANCE[backend][name]
    assert_close(out, expected, tolerance, "the layer's output")
    for n, g, e in zip(["q", "k", "v", *(n for n, _ in encoding.named_parameters())], grads, expected_grads):
        assert_close(g, e, tolerance, f"the gradient of {n}")


def test_a_kernel_that_refuses_in_its_backward_costs_the_step_one_retry_not_the_run(on_cuda, monkeypatch):
    """fla refusing in a kernel's backward (where fla 0.6's Hopper refusal is raised) surfaces in the
    step's loss.backward(), far from the layer: the step is taken again with fla's attention kernels
    refused (one warning), from the same batch, and the layers compute from their encoding's hooks."""
    from contextlib import nullcontext

    from conftest import TINY
    from posenc.build import build_model
    from posenc.data.batches import Batch
    from posenc.train.state import micro_batches, new_train_state, train_step

    # an op whose backward raises from a file of fla's package, as fla's Triton backward would
    source = ("import torch\n"
              "class Refusing(torch.autograd.Function):\n"
              "    @staticmethod\n"
              "    def forward(ctx, o):\n"
              "        return o.clone()\n"
              "    @staticmethod\n"
              "    def backward(ctx, grad):\n"
              f"        raise RuntimeError({HOPPER!r})\n")
    namespace = in_fla(source)
    [naive] = naive_ops()[fla_kernels.FORGETTING[0]]

    def refusing_in_backward(q, k, v, g, scale, window_size=None, cu_seqlens=None):
        return namespace["Refusing"].apply(naive(q, k, v, g, scale, window_size, cu_seqlens=cu_seqlens))

    on_cuda(naive=False)
    monkeypatch.setattr(fla_kernels, "load", lambda module, names: (refusing_in_backward,))
    cfg = compose(["encoding=fox", *TINY])
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=64)
    idx = torch.randint(64, (4, 33), generator=torch.Generator().manual_seed(0))

    class Same:
        def next(self) -> Batch:
            return Batch(idx[:, :-1], idx[:, 1:])

    state = new_train_state(model, cfg.trainer, Same(), torch.device("cpu"), nullcontext)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = train_step(state, micro_batches(state))
    [fla] = [str(w.message) for w in said if "flash-linear-attention" in str(w.message)]
    assert "parallel_forgetting_attn" in fla and "Hopper" in fla
    assert state.step == 1 and torch.isfinite(result.loss)
    # not tried again in this run, and the run says so: the layer kind, its paths, the step
    assert state.kernels.fused_is_refused("global")
    [fallback] = state.kernels.record()["fallbacks"]
    assert (fallback["layer_kind"], fallback["left"], fallback["took"], fallback["step"]) == \
        ("global", "fused:parallel_forgetting_attn", "hooks", 1)


@pytest.mark.parametrize("name", ["fox", "path", "stick_breaking"])
def test_a_bug_in_the_adapters_reshape_is_raised_not_blamed_on_fla(name, on_cuda, monkeypatch):
    """Only fla's own refusal counts as fla refusing: an error of posenc's adapter around the call
    (here its reshape to fla's flattened layout, broken) is raised as it is, never a permanent
    O(T²) path with a warning that blames fla."""
    encoding = encoding_of(name, torch.float32)
    encoding.prepare(128)
    q, k, v, x = inputs(128, seed=3, dtype=torch.float32)
    on_cuda()

    def broken(mask, *tensors):  # one token too many in the flattened sequence: the reshape fails
        B, T = tensors[0].shape[0], tensors[0].shape[2]
        return [t.transpose(1, 2).reshape(1, B * T + 1, *t.shape[1:2], -1) for t in tensors], None

    monkeypatch.setattr(fla_kernels, "to_fla", broken)
    ctx = context(128, segments_of(128, 5), Window(), torch.float32)
    policy = KernelPolicy()
    chosen = attention.plan(encoding, ctx, 0, 0.0, policy)
    assert isinstance(chosen, attention.FusedPlan)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="shape"):
            attention.attend_layer(q, k, v, encoding, ctx.with_input(x), 0, chosen)
    assert not chosen.failed and not any("flash-linear-attention" in str(w.message) for w in said)
    assert not policy.fused_is_refused(chosen.kind) and policy.fallbacks == []
