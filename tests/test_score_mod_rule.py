"""What a compiled CUDA training run needs of the model's graph, checked on a CPU with torch's own
tracers (dynamo, aot_autograd), nothing lowered:

- FlexAttention's backward takes every score_mod the shipped encodings give it: each captured
  tensor that needs a gradient indexed once (inductor's own ``validate_joint_graph``, run by
  `posenc check`'s row in posenc/check/flex_backward.py), and a plug-in that breaks the rule fails
  that row, naming the tensor;
- no cumulative sum reaches inductor as a scan of its own: every one in the forward (FoX's log
  gates, the recurrences' within-chunk decays, CoPE's and stick-breaking's reversed sums) and in
  the backward is ``posenc::cumsum`` (posenc/nn/cumsum.py), which torch.library's opcheck and
  gradcheck hold to its contract.
"""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch

from posenc.build import build_encoding, build_model
from posenc.check import Status, compose_subject
from posenc.check.flex_backward import backward_problem, score_mod_backward
from posenc.check.runner import CHECKS
from posenc.config.searchpath import add_config_dirs
from posenc.config import compose, group_options
from posenc.nn import flex
from posenc.nn.cumsum import _cumsum, cumsum
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.cope import contextual_positions
from posenc.nn.encodings.fox import cumulative_log_gates
from posenc.nn.encodings.stick_breaking import stick_breaking_weights

#: the shipped encodings whose position bias or decays FlexAttention receives as a score_mod
SCORE_MODS = {"alibi", "fire", "fox", "fox_rope", "kerple", "t5_bias"}
T = 64

TWICE_INDEXED = '''
"""b_h(i, j) = w_h[i] - w_h[j], a learned value per position: a plug-in whose score_mod looks up
one tensor for the query and again for the key (or, with clone: true, a copy for the key)."""
import torch
from torch import nn

from posenc.nn.encodings.base import PositionalEncoding, positions_at


class PositionValue(PositionalEncoding):
    def __init__(self, d_model: int, n_head: int, name: str = "position_value", clone: bool = False) -> None:
        super().__init__(d_model, n_head, name)
        self.w = nn.Parameter(torch.randn(n_head, 64))
        self.clone = clone

    def position_bias(self, q_pos, k_pos):  # (..., Tq), (..., Tk) -> (..., H, Tq, Tk)
        return (self.w[:, q_pos][..., :, None] - self.w[:, k_pos][..., None, :]).movedim(0, -3)

    def score_mod(self, ctx):
        pos = None if ctx.default_positions else ctx.pos
        w, w_key = self.w, self.w.clone() if self.clone else self.w

        def mod(score, b, h, q_idx, kv_idx):
            qi, kj = positions_at(pos, b, q_idx, kv_idx)
            return score + w[h, qi] - w_key[h, kj]

        return mod
'''


@pytest.mark.parametrize("name", group_options("encoding"))
def test_flex_attention_backward_takes_every_shipped_score_mod(name):
    """Inductor's rule, for each layer kind's score_mod (and FoX's decays through flex.with_decay)
    as training builds it: the row passes where FlexAttention gets a score_mod, says why not elsewhere."""
    row, = score_mod_backward(compose_subject([f"encoding={name}"]))
    assert row.status is (Status.PASS if name in SCORE_MODS else Status.NOT_OFFERED), row


def test_path_fox_decays_pass_the_rule_through_with_decay():
    """PaTH-FoX writes its logits out (PaTH replaces q·k), so the row does not trace it; its decays
    as FlexAttention would take them pass all the same, alone and after another score_mod."""
    encoding = build_encoding(compose(["encoding=path_fox", "model.d_model=64", "model.n_head=4"])).double()
    x = torch.randn(2, T, 64, dtype=torch.float64)
    c = encoding.decay(Context.arange(T, dtype=torch.float64).with_input(x), 1)
    assert c.requires_grad
    q, k, v = (torch.randn(2, 4, T, 16, dtype=torch.float64) for _ in range(3))
    table = torch.randn(4, T, dtype=torch.float64, requires_grad=True)  # a distance table, looked up once
    assert backward_problem(flex.with_decay(None, c), q, k, v) is None
    assert backward_problem(flex.with_decay(lambda s, b, h, i, j: s + table[h, i - j], c), q, k, v) is None


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    (root / "position_value.py").write_text(TWICE_INDEXED)
    (root / "conf" / "encoding").mkdir(parents=True)
    for name, clone in (("twice", "false"), ("cloned", "true")):
        (root / "conf" / "encoding" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            _target_: position_value.PositionValue
            name: {name}
            clone: {clone}
            """))
    return root


def test_a_plugin_score_mod_that_indexes_one_grad_tensor_twice_fails_the_row_naming_it(plugin, monkeypatch):
    """bias[q_idx] - bias[kv_idx] on one learned tensor: ✗, naming it; the same with a clone for the
    key's lookup (torch's own advice) passes."""
    monkeypatch.syspath_prepend(str(plugin))
    check = dict(CHECKS)["score_mod backward"]
    add_config_dirs([plugin / "conf"])  # as --config-dir does (the autouse fixture restores POSENC_CONFIG_PATH)
    row, = check(compose_subject(["encoding=twice"]))
    assert row.status is Status.FAIL
    assert "`w` indexed more than once" in row.note and "clone" in row.note
    row, = check(compose_subject(["encoding=cloned"]))
    assert row.status is Status.PASS, row


def test_a_torch_without_the_rule_gets_a_row_that_says_so(monkeypatch):
    """Older torch keeps no validate_joint_graph (or elsewhere): the row is not offered, never a ✗."""
    from posenc.check import flex_backward

    monkeypatch.setattr(flex_backward, "RULE_MODULES", ("torch._inductor.no_such_module",))
    row, = score_mod_backward(compose_subject(["encoding=alibi"]))
    assert row.status is Status.NOT_OFFERED and "has no validate_joint_graph" in row.note


# --- cumulative sums: one opaque op, forward and backward ------------------------------------
@pytest.mark.parametrize("reverse", [False, True])
def test_the_cumsum_op_keeps_torch_library_s_contract_and_its_gradient(reverse):
    """opcheck (schema, fake tensor, autograd registration, aot dispatch) on contiguous and
    transposed inputs and on bools; gradcheck and gradgradcheck in float64; equal to torch's own."""
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    for sample in (x, x.transpose(1, 2), x.detach(), torch.rand(3, 7) > 0.5):
        torch.library.opcheck(_cumsum, (sample, 1, reverse))
    torch.autograd.gradcheck(lambda t: cumsum(t, 1, reverse), (x,))
    torch.autograd.gradgradcheck(lambda t: cumsum(t, -1, reverse), (x,))
    want = x.flip(1).cumsum(1).flip(1) if reverse else x.cumsum(1)
    assert torch.equal(cumsum(x, 1, reverse), want)


def test_under_bf16_autocast_fox_s_cumulative_gates_stay_float32():
    """The op keeps the caller's dtype: FoX sums its log gates in float32 under a bf16 autocast,
    equal to torch.cumsum's float32 sum."""
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 4, 1024))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = cumulative_log_gates(log_f)
        product = (torch.randn(8, 8) @ torch.randn(8, 8))  # what autocast does run in bf16
    assert c.dtype == torch.float32 and product.dtype == torch.bfloat16
    assert torch.equal(c, log_f.cumsum(-1))


def aot_graphs(fn, *inputs: torch.Tensor) -> dict[str, list[torch.fx.GraphModule]]:
    """The forward and backward graphs aot_autograd makes of fn(*inputs).sum() and its gradient
    (dynamo, no inductor)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: dict[str, list[torch.fx.GraphModule]] = {"forward": [], "backward": []}

    def keep(kind: str):
        return lambda gm, _: graphs[kind].append(gm) or make_boxed_func(gm)

    torch.compiler.reset()
    traced = torch.compile(fn, backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced(*inputs).sum().backward()
    torch.compiler.reset()
    return graphs


def assert_no_scan_left(graphs: dict[str, list[torch.fx.GraphModule]]) -> None:
    for kind in ("forward", "backward"):
        targets = {str(n.target) for gm in graphs[kind] for n in gm.graph.nodes if n.op == "call_function"}
        assert not any("aten.cumsum" in t for t in targets), (kind, sorted(targets))
        assert "posenc.cumsum.default" in targets, kind


def test_a_training_step_of_fox_path_and_a_recurrent_layer_leaves_no_cumsum_to_inductor():
    """PaTH-FoX's forget gates in the softmax layer of a hybrid whose recurrent (gated delta rule)
    layer sums its decays chunk by chunk (T = 64: two chunks): posenc.cumsum in the forward and the
    backward graph of the whole model's loss, never aten.cumsum (the scan inductor failed to lower)."""
    cfg = compose(["layout=hybrid", "encoding=path_fox", "model.d_model=64", "model.n_head=4", "model.n_layer=2",
                   f"trainer.seq_len={T}"])
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=64).train()
    assert [model.encoding.for_layer(i).name for i in range(2)] == ["nope", "path_fox"]
    x = torch.randint(64, (2, T))
    assert_no_scan_left(aot_graphs(lambda x: model(x, x)[1], x))


def test_cope_and_stick_breaking_sum_through_the_op_too():
    """Their reversed sums over keys (the flip-cumsum-flip of both papers' code)."""
    scores = torch.randn(2, 4, T, T, requires_grad=True)
    stick = torch.ones(T, T, dtype=torch.bool).tril(-1)
    assert_no_scan_left(aot_graphs(lambda s: contextual_positions(torch.sigmoid(s)), scores))
    assert_no_scan_left(aot_graphs(lambda s: stick_breaking_weights(s, stick), scores))


def test_kdas_per_channel_decays_sum_through_the_op():
    """Kimi Linear's KDA layers (layout=kimi_linear): their per-channel within-chunk decays too."""
    cfg = compose(["layout=kimi_linear", "model.d_model=64", "model.n_head=4", "model.n_layer=4",
                   f"trainer.seq_len={T}"])
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=64).train()
    x = torch.randint(64, (2, T))
    assert_no_scan_left(aot_graphs(lambda x: model(x, x)[1], x))
