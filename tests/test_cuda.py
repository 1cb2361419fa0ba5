"""Every encoding is correct on a GPU: the kernels CUDA picks (FlexAttention for a
position bias, SDPA's fused kernels otherwise) give the same loss and gradients as the float-mask
reference, compiled bf16 training lowers the loss, and a GPU run matches a CPU run.

And at the shapes users train: head_dim 64 and 128 at T = 1024, where a kernel can fail
to compile that compiles at head_dim 16 (FlexAttention's tiles are bounded by shared memory, which
grows with head_dim: T5's bias did not compile at head_dim 64 on an H200 while the head_dim-16
tests passed). Compiled bf16 training for every encoding at head_dim 64, and at 128 for those
whose layers run FlexAttention (without one, attention is SDPA's flash/cuDNN kernels, torch's
own, built for both); every layout at head_dim 128 (its windows' BlockMasks, its recurrent
mixers' kernels); FlexAttention against the explicit mask in fp32 at both head dims. A fallback
from a planned FlexAttention announced while these run fails the test.

The budget: the whole `pytest -m cuda -n 4` within ~4 minutes on an H100 (~2.5 min before these),
and a compile costs ~5-10 s there, so these tests compile about 21 + 9 + 11 models and ~18
FlexAttention kernels: 2 heads (a kernel's tiles depend on head_dim, not on the head count), one
layer (two for the layouts, so that each has two layer kinds), 4 steps on one batch of 2 × 1024
tokens — estimated at ~80 s of the 4 workers' time, not yet timed on a GPU.

All skip without CUDA (CI has none). On a GPU machine: `pytest -m cuda` (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from conftest import TINY, run_cli, run_dirs
from posenc.build import build_model
from posenc.config import compose, group_options
from posenc import errors
from posenc.nn import attention
from posenc.nn.encodings.base import Context

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ENCODINGS = group_options("encoding")
LAYOUTS = group_options("layout")
# head_dim 16 (FlexAttention's smallest) and T beyond a learned table's default
SHAPE = ["model.n_layer=2", "model.n_head=4", "model.d_model=64", "trainer.seq_len=256"]


def cuda_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(compose([f"encoding={name}", *SHAPE]), vocab_size=64).cuda()
    for p in model.encoding.parameters():  # T5's table starts at zero: make the bias visible
        torch.nn.init.normal_(p, std=0.5)
    return model


def assert_same_loss_and_gradients(got: tuple, reference: tuple) -> None:
    """(loss, {parameter: gradient}) of the path under test equal the reference's, in fp32."""
    (loss, grads), (ref_loss, ref_grads) = got, reference
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-4)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-4, rtol=1e-3, msg=n)


@pytest.mark.parametrize("name", ENCODINGS)
def test_cuda_kernels_equal_the_float_mask_reference_in_fp32(name, monkeypatch):
    """Loss and every parameter's gradient (bias tables included) of the path CUDA chooses equal
    SDPA with an explicit float mask, in fp32 without compile."""
    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setattr(attention, "fused_plan", lambda *args: None)  # fla's kernels: test_fla_attention.py
    idx = torch.randint(64, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    results = []
    for reference in (False, True):
        model = cuda_model(name)
        if reference:  # every bias through the dense float mask; no bias: the mask is causal alone
            monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("sdpa", None))
        elif model.encoding.offers("position_bias"):
            assert isinstance(attention.plan(model.encoding, Context.arange(256, "cuda"), 0, 0.0, model.kernels),
                              attention.FlexPlan)
        _, loss = model(idx, idx)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    assert_same_loss_and_gradients(*results)


@pytest.mark.parametrize("name", ENCODINGS)
def test_compiled_bf16_training_lowers_the_loss(name):
    losses, _ = compiled_bf16_losses(cuda_model(name), steps=20, batch=8, T=256)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", ["rope", "t5_bias", "alibi"])
def test_a_gpu_run_reaches_the_cpu_runs_validation_loss(name, workdir):
    """The same short run on the GPU (bf16, compiled, FlexAttention) and on the CPU (fp32, SDPA
    with a float mask) reaches the same validation loss within 3%: the device does not change
    the experiment."""
    losses = {}
    for device in ("cpu", "cuda"):
        result = run_cli("train", *TINY, f"encoding={name}", f"device={device}", "trainer.max_steps=60",
                         "model.d_model=64", "trainer.eval_interval=60", cwd=workdir)
        assert result.returncode == 0, result.stderr
        newest = max(run_dirs(workdir), key=lambda p: p.stat().st_mtime)
        losses[device] = json.loads((newest / "summary.json").read_text())["val/loss"]
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=0.03), losses


@pytest.mark.parametrize("masking", ["documents", "sliding", "documents+chunk"])
@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5_bias", "fire", "cope",
                                  "fox", "stick_breaking", "ssmax", "sink", "pope"])
def test_cuda_block_masks_equal_the_explicit_mask_reference(name, masking, monkeypatch):
    """Documents and windows on CUDA: FlexAttention with the mask's BlockMask (built once per
    forward, shared by the layers with that mask) gives the loss and every gradient of SDPA with
    an explicit mask, in fp32 without compile."""
    from posenc.nn.mask import document_positions

    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setattr(attention, "fused_plan", lambda *args: None)  # fla's kernels: test_fla_attention.py
    layout = {"documents": [], "sliding": ["layout=sliding", "layout.window=48"],
              "documents+chunk": ["layout=sliding", "layout.window=64", "layout.kinds.local.chunked=true"]}[masking]
    idx = torch.randint(64, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    doc = None
    if masking.startswith("documents"):  # documents of 40, 100, 116 and 256 tokens
        doc = torch.tensor([[0] * 40 + [1] * 100 + [2] * 116, [0] * 256], device="cuda")
    results = []
    for reference in (False, True):
        torch.manual_seed(0)
        model = build_model(compose([f"encoding={name}", *SHAPE, *layout]), vocab_size=64).cuda()
        for p in model.encoding.parameters():
            torch.nn.init.normal_(p, std=0.5)
        if reference:
            monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("sdpa", None))
        pos = None if doc is None else document_positions(doc)
        _, loss = model(idx, idx, pos=pos, doc=doc, length=256)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss, grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-4)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-4, rtol=1e-3, msg=n)


def test_posenc_eval_on_a_gpu_computes_what_training_reported(workdir):
    """Training and `posenc eval` set the device up alike (TF32, autocast: hardware.setup_device),
    so the perplexity at the training length that training reported is the one a re-run gives
    (an eval without TF32 would round its fp32 matmuls differently)."""
    result = run_cli("train", *TINY, "device=cuda", "trainer.precision=fp32", "trainer.compile=false",
                     "eval.at_end=true", "eval.lengths=[1]", cwd=workdir)
    assert result.returncode == 0, result.stderr
    [run_dir] = run_dirs(workdir)
    trained = json.loads((run_dir / "summary.json").read_text())["extrapolation/ppl@32"]
    result = run_cli("eval", str(run_dir), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "eval.json").read_text())["extrapolation/ppl@32"] == pytest.approx(trained, rel=1e-6)


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("overrides", [["encoding=fox"], ["encoding=fox_rope"], ["encoding=fox", "encoding@encoding.inner=alibi"],
                                       ["encoding=sink"], ["encoding=sink", "encoding@encoding.inner=alibi"]],
                         ids=["fox", "fox_rope", "fox_alibi", "sink", "sink_alibi"])
def test_decays_and_sinks_run_in_flex_attention_with_the_references_loss_and_gradients(overrides, documents,
                                                                                     monkeypatch):
    """FoX's c_i - c_j as a score_mod over the captured (B, H, T) decays and the sink through
    FlexAttention's log-sum-exp: CUDA picks FlexAttention for them (no fallback), and the loss and
    every gradient (the gates' and the sink's included) equal SDPA's explicit-mask path, in fp32."""
    from posenc.nn.mask import document_positions

    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setattr(attention, "fused_plan", lambda *args: None)  # fla's kernels: test_fla_attention.py
    idx = torch.randint(64, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    doc = torch.tensor([[0] * 40 + [1] * 100 + [2] * 116, [0] * 256], device="cuda") if documents else None
    pos = None if doc is None else document_positions(doc)
    results = []
    for reference in (False, True):
        torch.manual_seed(0)
        model = build_model(compose([*overrides, *SHAPE, "layout=sliding", "layout.window=48"]), vocab_size=64).cuda()
        for p in model.encoding.parameters():
            torch.nn.init.normal_(p, std=0.5)
        if reference:
            monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("sdpa", None))
        else:
            ctx = model.context(idx, pos, doc, 256)
            assert isinstance(attention.plan(model.encoding, ctx, 0, 0.0, model.kernels), attention.FlexPlan)
        _, loss = model(idx, idx, pos=pos, doc=doc, length=256)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss, grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-4)
    assert grads.keys() == ref_grads.keys() and any(n.startswith("encoding.") for n in grads)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-4, rtol=1e-3, msg=n)


def test_stick_breaking_on_cuda_falls_back_to_the_explicit_path_and_trains(monkeypatch):
    """Without fla's kernel (test_fla_attention.py), FlexAttention computes a softmax, which
    stick-breaking replaces: the explicit path, one warning."""
    errors._WARNED.clear()
    monkeypatch.setattr(attention, "fused_plan", lambda *args: None)
    model = cuda_model("stick_breaking")
    idx = torch.randint(64, (2, 256), device="cuda")
    with pytest.warns(RuntimeWarning, match="replaces softmax"):
        _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)


#: the shapes users train: T = 1024, head_dim 64 (GPT-2 small) and 128 (Llama and most 2024-25 models)
USER_T = 1024
HEAD_DIMS = (64, 128)


def model_at(head_dim: int, *overrides: str, n_layer: int = 1) -> torch.nn.Module:
    """2 heads of head_dim, T = USER_T, on CUDA; every encoding parameter drawn from N(0, 0.5²) so
    that a table that starts at zero (T5's) takes part."""
    torch.manual_seed(0)
    cfg = compose([*overrides, f"model.n_layer={n_layer}", "model.n_head=2", f"model.d_model={2 * head_dim}",
                   f"trainer.seq_len={USER_T}", "model.dropout=0.0"])
    model = build_model(cfg, vocab_size=64).cuda()
    for p in model.encoding.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return model


def flex_layers(model: torch.nn.Module, idx: torch.Tensor, kinds: tuple[type, ...] = (attention.FlexPlan,)) -> int:
    """How many layers the model plans to run through FlexAttention (or ``kinds``) for idx (planning
    also says, once, why a layer leaves it by design, before any test listens for a fallback)."""
    ctx = model.context(idx, None, None, idx.shape[1])
    return sum(isinstance(p, kinds) for p in attention.plans(model.encoding, ctx, model.n_layer, 0.0, model.kernels))


def fallbacks(caught: list[warnings.WarningMessage]) -> list[str]:
    """FlexAttention's fallbacks, and fla's kernels refusing when they ran."""
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
            and ("FlexAttention" in str(w.message) or "flash-linear-attention" in str(w.message))]


def compiled_bf16_losses(model: torch.nn.Module, steps: int = 4, batch: int = 2,
                         T: int | None = None) -> tuple[list[float], list[str]]:
    """AdamW steps of the compiled model under bf16 autocast on one batch of batch × T tokens (T:
    USER_T unless given): the losses, and the FlexAttention fallbacks announced meanwhile."""
    T = T or USER_T
    idx = torch.randint(64, (batch, T + 1), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    x, y = idx[:, :-1], idx[:, 1:]
    flex_layers(model, x)
    torch._dynamo.reset()  # a fresh compile per model: one worker compiles dozens, past dynamo's recompile limit
    step_model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):  # the same batch: a model that can learn memorises it
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = step_model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    return losses, fallbacks(caught)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", ENCODINGS)
def test_compiled_bf16_training_at_the_shapes_users_train(name, head_dim):
    """Every encoding compiles and trains in bf16 at head_dim 64, T 1024; at head_dim 128 those
    whose layers run FlexAttention (the kernel posenc compiles; SDPA's are torch's own) or fla's."""
    model = model_at(head_dim, f"encoding={name}")
    kinds = (attention.FlexPlan, attention.FusedPlan)
    if head_dim == 128 and not flex_layers(model, torch.zeros(1, USER_T, dtype=torch.long, device="cuda"), kinds):
        pytest.skip("no layer runs FlexAttention or fla: SDPA's kernels, covered at head_dim 64")
    losses, fell = compiled_bf16_losses(model)
    assert not fell, fell
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compiled_bf16_training_of_every_layout_at_head_dim_128(layout):
    """Each layout's first two layers (a window's BlockMask, a recurrent mixer's kernels) with its
    default encoding compile and train in bf16 at head_dim 128, T 1024."""
    losses, fell = compiled_bf16_losses(model_at(128, f"layout={layout}", n_layer=2))
    assert not fell, fell
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", ENCODINGS)
def test_flex_attention_equals_the_explicit_mask_at_the_shapes_users_train(name, head_dim, monkeypatch):
    """FlexAttention's compiled kernel, forward and backward in fp32, gives the loss and every
    gradient of SDPA with the explicit float mask at head_dim 64 and 128, T 1024."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(attention, "fused_plan", lambda *args: None)  # fla's kernels: test_fla_attention.py
    idx = torch.randint(64, (1, USER_T), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    results = []
    for reference in (False, True):
        model = model_at(head_dim, f"encoding={name}")
        if reference:
            monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("sdpa", None))
        elif not flex_layers(model, idx):
            pytest.skip("no layer runs FlexAttention: the explicit mask is this encoding's CUDA path")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, loss = model(idx, idx)
            loss.backward()
        assert reference or not fallbacks(caught), fallbacks(caught)
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    assert_same_loss_and_gradients(*results)
