"""FlexAttention's compiled backward accepts the encoding's score_mod: every tensor it captures that
needs a gradient is indexed once.

On CUDA a position bias and FoX's decays reach FlexAttention as a ``score_mod`` over captured
tensors, and a learned table gets its gradient through the capture: in the backward, each lookup
``t[idx]`` becomes a scatter of the score's gradient into t's (``flex_lib.zeros_and_scatter``).
Inductor lowers that scatter only when it is the whole gradient of its tensor. A tensor looked up
twice (``bias[q_idx] + bias[kv_idx]``, FoX's ``c[b, h, q_idx] - c[b, h, kv_idx]``, an MLP's weights
indexed per hidden unit) has two scatters summed, and inductor's ``validate_joint_graph``
(torch/_inductor/kernel/flex/flex_attention.py) refuses the graph: "Using multiple indexing
operations on the same tensor that requires gradients in a score_mod function is not currently
supported". That refusal comes when a compiled training run on a GPU lowers its first backward.

The same function is run here on a CPU, before anything is compiled: dynamo traces flex_attention
with the score_mod (fullgraph), aot_autograd builds its backward, and the backward compiler hands
each ``flex_attention_backward``'s joint graph (the score_mod's forward and gradient) to torch's
``validate_joint_graph``, then stops: nothing is lowered or run. q, k and v need no gradient
(FlexAttention has no backward on CPU); the encoding's parameters need theirs, as in training, so
the joint graph holds every captured gradient. Each layer kind's score_mod is traced at positions
0..T-1, and also at per-document positions where its bias reads positions (a relative bias is
computed at window indices under documents packing, as attention.plan does).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.check.hooks import layer_encodings
from posenc.check.paths import flex_offered
from posenc.check.results import CheckResult, holds, not_offered
from posenc.check.subject import Subject
from posenc.nn import flex, torch_private
from posenc.nn.encodings.base import Context, ScoreMod
from posenc.nn.mask import document_positions

NAME = "score_mod: each grad tensor indexed once"
#: where torch keeps the rule (posenc/nn/torch_private.py)
RULE_MODULES = torch_private.FLEX_RULE_MODULES
#: the batch the score_mods are traced with (heads and T are the subject's)
B = 2


def joint_graph_rule() -> Callable[[torch.fx.Graph], None] | None:
    """Inductor's ``validate_joint_graph`` (raises NotImplementedError on a graph it will not lower),
    or None where this torch has none."""
    return torch_private.flex_joint_graph_rule(RULE_MODULES)


def why_not_traced() -> str | None:
    """Why this torch cannot run the check here, or None where it can."""
    if not flex.AVAILABLE:
        return "this torch has no FlexAttention"
    if not torch_private.dynamo_supported():
        return "torch.compile does not run on this Python"
    if joint_graph_rule() is None or not hasattr(torch.ops.higher_order, "flex_attention_backward"):
        return "this torch's inductor has no validate_joint_graph for FlexAttention's backward"
    return None


class _Inspected(Exception):
    """Raised by the backward compiler once it has read the joint graphs, so that nothing runs."""


def backward_problem(score_mod: ScoreMod, q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """What inductor's FlexAttention backward refuses in score_mod, naming the captured tensors
    indexed more than once where they can be told; None where it accepts it (or where nothing it
    captures needs a gradient). q, k, v: (B, H, T, E), not requiring grad."""
    rule, captured, refused, inspected = joint_graph_rule(), [], [], []

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> None:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.higher_order.flex_attention_backward:
                joint = getattr(gm, node.args[8].target).graph  # args: q, k, v, out, lse, grads, fw, joint, …
                try:
                    rule(joint)
                except NotImplementedError as e:
                    refused.append((str(e).split(". ")[0], summed_scatters(joint)))
        inspected.append(True)
        raise _Inspected

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from functorch.compile import make_boxed_func

        captured.extend(captured_tensors(gm))
        return torch_private.aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g), bw_compiler=backward_compiler)(
            gm, example_inputs)

    torch.compiler.reset()  # a trace of its own (and no recompile limit over many subjects)
    attend = torch.compile(lambda q, k, v: flex.flex_attention(q, k, v, score_mod=score_mod), backend=backend,
                           fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is slow
        out = attend(q, k, v)
        if out.requires_grad:
            try:
                out.sum().backward()
            except Exception:  # _Inspected, however the autograd engine wraps it
                if not inspected:
                    raise
    torch.compiler.reset()
    if not refused:
        return None
    message, outputs = refused[0]
    names = [name_of(captured[i], score_mod) for i in outputs if -len(captured) <= i]
    return f"{', '.join(names)} indexed more than once" if names else message


def summed_scatters(joint: torch.fx.Graph) -> list[int]:
    """The captured tensors whose gradient in the joint graph sums more than one lookup's scatter,
    as negative positions: the joint graph's outputs end with one gradient per captured tensor."""
    outputs = list(next(n for n in joint.nodes if n.op == "output").args[0])
    scatter = getattr(getattr(torch.ops.flex_lib, "zeros_and_scatter", None), "default", None)
    return [i - len(outputs) for i, node in enumerate(outputs)
            if scatter is not None and isinstance(node, torch.fx.Node) and node.target is not scatter
            and any(a.target is scatter for a in ancestors(node))]


def ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    seen, todo = set(), [node]
    while todo:
        for parent in todo.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def captured_tensors(gm: torch.fx.GraphModule) -> list[Tensor | None]:
    """The tensors dynamo lifted for flex_attention's score_mod, in its order (args[7]: the
    score_mod's other buffers), each the caller's own tensor where dynamo kept it (else None)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.flex_attention:
            graph_arg = (getattr(b, "meta", {}).get("grapharg") for b in node.args[7])
            return [getattr(g, "example", None) for g in graph_arg]
    return []


def name_of(tensor: Tensor | None, score_mod: ScoreMod) -> str:
    """The name score_mod (or a function it closes over) gives the tensor, in backticks."""
    todo, seen = [score_mod], set()
    while todo:
        fn = todo.pop()
        seen.add(id(fn))
        for name, cell in zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()), fn.__closure__ or ()):
            value = cell.cell_contents
            if value is tensor:
                return f"`{name}`"
            if callable(value) and id(value) not in seen:
                todo.append(value)
    return "a captured tensor" if tensor is None else f"a captured tensor of shape {tuple(tensor.shape)}"


def training_score_mods(s: Subject) -> tuple[list[tuple[str, ScoreMod, tuple[int, ...]]], str]:
    """(where, score_mod, the q, k, v shape) for each layer kind's FlexAttention score_mod as training
    builds it (the encodings in training mode, their parameters requiring grad; FoX's decays from a random block input,
    joined by flex.with_decay); and why there are none, where there are none."""
    T, doc = s.T, s.documents()
    mods, why_not = [], "no position bias or decay"
    g = torch.Generator().manual_seed(3)
    for layer, encoding in layer_encodings(s, "train"):  # as training builds them
        if not (encoding.offers("position_bias") or encoding.offers("decay")):
            continue
        contexts = {"positions 0..T-1": Context.arange(T, dtype=torch.float64)}
        if encoding.offers("position_bias") and not encoding.offers("distance_bias"):
            contexts["per-document positions"] = Context.at(document_positions(doc), torch.float64, doc,
                                                            n_positions=T)
        x = torch.randn(B, T, encoding.d_model, generator=g, dtype=torch.float64)  # the block's input
        for where, ctx in contexts.items():
            encoding.prepare(ctx.n_positions)
            why = flex_offered(encoding, ctx)
            if why is not None:
                why_not = why
                continue
            mod = encoding.score_mod(ctx) if encoding.offers("position_bias") else None
            decay = encoding.decay(ctx.with_input(x), layer) if encoding.offers("decay") else None
            mods.append((f"layer {layer}, {where}", flex.with_decay(mod, decay),
                         (B, encoding.n_head, T, encoding.head_dim)))
    return mods, why_not


def score_mod_backward(s: Subject) -> list[CheckResult]:
    """Every score_mod a training forward gives FlexAttention passes inductor's rule for its backward."""
    why = why_not_traced()
    mods, why_none = training_score_mods(s) if why is None else ([], why)
    if not mods:
        return [not_offered(NAME, why_none)]
    g = torch.Generator().manual_seed(2)
    failed = []
    for where, mod, shape in mods:
        q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
        problem = backward_problem(mod, q, k, v)
        if problem is not None:
            failed.append(f"{where}: {problem}")
    measured = f"{len(mods)} score_mod{'s' if len(mods) > 1 else ''} traced"
    return [holds(NAME, not failed, measured, "; ".join(failed) + " — FlexAttention's compiled backward refuses "
                  "it: index each captured tensor that needs a gradient once (a clone for a second lookup)")]
