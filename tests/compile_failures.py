"""Dynamo backends that fail as a GPU's compilers failed, for a real ``torch.compile`` on a CPU.

Each is a real backend (``torch.compile(..., backend=...)``; posenc takes one by name from
``POSENC_COMPILE_BACKEND=compile_failures:<name>``, posenc/nn/failures.py): what it does not fail it
compiles with AOTAutograd (``aot_eager``: the joint graph traced and partitioned, no code generated),
so the rest of the model really runs compiled. The errors are the ones an H200 printed:

- ``flex_at_compile``: a graph holding a FlexAttention kernel does not compile (inductor's autotuning
  found no configuration that fits the shared memory: an ``InductorError`` around
  ``NoTritonConfigsError``, raised inside the backend, which dynamo wraps in ``BackendCompilerFailed``);
- ``flex_forward_at_run`` / ``flex_backward_at_run``: it compiles, and its forward (its backward) raises
  ``NoTritonConfigsError`` when first run, as inductor's lazily compiled Triton kernels do;
- ``elsewhere``: every graph fails with inductor's scan codegen error (FoX's cumulative sums on an
  H200, torch 2.11): a failure outside attention;
- ``flex_at_compile_on_rank_1``: ``flex_at_compile`` on rank 1 of a DDP run only;
- ``flex_at_compile_first``: ``flex_at_compile`` for the first ``FAIL_FIRST["graphs"]`` graphs holding
  FlexAttention in the process, then compiled (a sweep whose first job fell back).

FlexAttention has no compiled backward on a CPU: its Python entry refuses inputs that need gradients
before dynamo traces it (``_validate_device``). ``flex_on_the_cpu`` lifts that refusal, and plans
FlexAttention for a bias as on CUDA; a graph that holds it then compiles with AOTAutograd alone, its
backward FlexAttention's eager one (slow: it writes the scores out, fine at a test's shapes).
"""

from __future__ import annotations

import os

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.exc import InductorError
from torch._inductor.runtime.triton_heuristics import NoTritonConfigsError

#: what inductor raised for T5 at head_dim 64 on an H200 with torch's default kernel configuration
SHARED_MEMORY_ERROR = ("No valid triton configs. OutOfMemoryError: out of resource: "
                       "triton_tem_fused__unsafe_view_flex_attention_split_transpose_view_2 Required: 245760 "
                       "Hardware limit: 232448")
#: what inductor raised for FoX's cumulative sums on an H200 (torch 2.11, Triton 3.6)
SCAN_ERROR = "list indices must be integers or slices, not NoneType"

FLEX = (torch.ops.higher_order.flex_attention,)
FLEX_BACKWARD = (torch.ops.higher_order.flex_attention_backward,)
#: every graph each backend was handed: ("fw" | "bw" | "dynamo", holds FlexAttention) (what the tests read)
SEEN: list[tuple[str, bool]] = []


def holds(gm: torch.fx.GraphModule, ops: tuple) -> bool:
    return any(node.target in ops for node in gm.graph.nodes)


def _raises(error: Exception):
    def run(*args):
        raise error

    return run


def _compiler(stage: str, failing: tuple, error: Exception | None, at_run: bool):
    def compile_graph(gm: torch.fx.GraphModule, inputs):
        flex = holds(gm, failing)
        SEEN.append((stage, holds(gm, FLEX + FLEX_BACKWARD)))
        if flex and error is not None:
            if not at_run:
                raise error
            return make_boxed_func(_raises(error))
        return make_boxed_func(gm)

    return compile_graph


def _aot(fw_error: Exception | None = None, bw_error: Exception | None = None, at_run: bool = False):
    return aot_autograd(fw_compiler=_compiler("fw", FLEX, fw_error, at_run),
                        bw_compiler=_compiler("bw", FLEX_BACKWARD, bw_error, at_run))


def flex_at_compile(gm: torch.fx.GraphModule, inputs):
    if holds(gm, FLEX):
        SEEN.append(("dynamo", True))
        raise InductorError(NoTritonConfigsError(SHARED_MEMORY_ERROR), None)
    return _aot()(gm, inputs)


def flex_forward_at_run(gm: torch.fx.GraphModule, inputs):
    return _aot(fw_error=NoTritonConfigsError(SHARED_MEMORY_ERROR), at_run=True)(gm, inputs)


def flex_backward_at_run(gm: torch.fx.GraphModule, inputs):
    return _aot(bw_error=NoTritonConfigsError(SHARED_MEMORY_ERROR), at_run=True)(gm, inputs)


def elsewhere(gm: torch.fx.GraphModule, inputs):
    SEEN.append(("dynamo", holds(gm, FLEX)))
    raise InductorError(TypeError(SCAN_ERROR), None)


def flex_at_compile_on_rank_1(gm: torch.fx.GraphModule, inputs):
    if os.environ.get("RANK") == "1":
        return flex_at_compile(gm, inputs)
    return _aot()(gm, inputs)


#: how many more graphs holding FlexAttention ``flex_at_compile_first`` fails (a test sets it)
FAIL_FIRST = {"graphs": 0}


def flex_at_compile_first(gm: torch.fx.GraphModule, inputs):
    if holds(gm, FLEX) and FAIL_FIRST["graphs"] > 0:
        FAIL_FIRST["graphs"] -= 1
        return flex_at_compile(gm, inputs)
    SEEN.append(("dynamo", holds(gm, FLEX)))
    return _aot()(gm, inputs)


def flex_on_the_cpu(monkeypatch) -> None:
    """Plan FlexAttention on the CPU, as attention plans it on CUDA, and let dynamo trace it with
    inputs that need gradients (module doc)."""
    import torch.nn.attention.flex_attention as flex_module

    from posenc.nn import attention

    monkeypatch.setattr(attention, "select_kernel", lambda *a, **k: ("flex", None))
    monkeypatch.setattr(flex_module, "_validate_device", lambda *a, **k: None)
