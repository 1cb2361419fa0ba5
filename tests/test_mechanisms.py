"""Position through the attention itself, each pinned to its paper: FoX's forget gates,
stick-breaking attention, SSMax, attention sinks, PoPE; and how they compose with the encodings.

Every attention path with document and window masks, and "a packed document is computed as the
document alone", run over every encoding (these included) by `posenc check` in test_check.py; the FlexAttention forms of the decays and the sink are checked here on
CPU (eager forward), on CUDA in test_cuda.py.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings

import pytest
import torch

from posenc.build import build_encoding, build_model
from posenc.config import compose, encoding_catalogue
from posenc.errors import UserError
from posenc import errors
from posenc.nn import attention, flex
from posenc.nn import dense as explicit_mask
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.stick_breaking import stick_breaking_weights
from posenc.check.reference import causal, reference
from posenc.nn.mask import AttentionMask, Window, document_positions
from posenc.nn.kernels import KernelPolicy

V, T, B, H, HD = 64, 24, 2, 4, 8
SHAPE = ["model.n_layer=2", "model.n_head=4", "model.d_model=32", "trainer.seq_len=64"]
DOC = torch.tensor([[0] * 7 + [1] * 10 + [2] * 7, [0] * 15 + [1] * 9])


@functools.cache
def config(*overrides: str):
    return compose([*SHAPE, *overrides])


def model_of(*overrides: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config(*overrides), vocab_size=V).double().eval()


def qkv(seed: int = 0, heads: int = H, dim: int = HD):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, heads, T, dim, generator=g, dtype=torch.float64) for _ in range(3))


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


def same_weights(source: torch.nn.Module, target: torch.nn.Module) -> torch.nn.Module:
    """target with source's token embeddings, blocks and head (not the mechanism's own)."""
    state = {k: v for k, v in source.state_dict().items() if not k.startswith("encoding.")}
    missing, unexpected = target.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("encoding.") for k in missing)
    return target


# --- composition ----------------------------------------------------------------------------
def test_a_mechanism_wraps_the_encoding_its_config_names():
    """encoding@encoding.inner picks the wrapped encoding, encoding.inner.<key> its options; what the
    wrapper offers is its own hook plus everything the inner encoding offers."""
    fox = build_encoding(config("encoding=fox", "encoding@encoding.inner=alibi"))
    assert fox.inner.name == "alibi" and fox.offers("decay") and fox.offers("position_bias") and fox.offers("distance_bias")
    rope = build_encoding(config("encoding=ssmax", "encoding.inner.base=500"))
    assert rope.inner.name == "rope" and rope.inner.base == 500 and rope.offers("logit_scale") and not rope.offers("position_bias")
    nested = build_encoding(config("encoding=sink", "encoding@encoding.inner=ssmax"))  # a sink around SSMax(RoPE)
    assert nested.offers("sink_logit") and nested.offers("logit_scale") and nested.inner.inner.name == "rope"
    with pytest.raises(UserError, match="choose it with encoding@encoding.inner=rope"):
        build_encoding(config("encoding=fox", "encoding.inner=rope"))  # a name where a config belongs


def test_a_mechanism_takes_its_sizes_from_the_encoding_it_wraps():
    """A mechanism's constructor names no d_model or n_head, so the builder passes it none: its width
    and heads are its inner encoding's, and its per-layer, per-head parameters have their shapes."""
    for name in ("fox", "sink", "ssmax", "stick_breaking", "path"):
        encoding = build_encoding(config(f"encoding={name}"))
        assert not {"d_model", "n_head"} & set(inspect.signature(type(encoding)).parameters), name
        assert (encoding.d_model, encoding.n_head, encoding.head_dim) == (encoding.inner.d_model, 4, 8), name
    assert build_encoding(config("encoding=fox")).gate_weight.shape == (2, 4, 32)  # (layer, head, d_model)


def test_the_encodings_list_shows_what_a_mechanism_wraps_and_extends():
    """`posenc encodings`: fox_rope is fox's options with RoPE inside, and builds so."""
    options = {name: opts for name, _, opts in encoding_catalogue()}
    assert options["fox"]["inner"] == "nope" and options["fox_rope"] == {**options["fox"], "inner": "rope"}
    fox_rope = build_encoding(config("encoding=fox_rope"))
    assert fox_rope.inner.name == "rope" and fox_rope.offers("decay")


def test_a_sink_cannot_join_a_normaliser_that_is_not_softmax():
    with pytest.raises(UserError, match="replaces"):
        build_encoding(config("encoding=sink", "encoding@encoding.inner=stick_breaking"))
    with pytest.raises(UserError, match="adds a sink"):
        build_encoding(config("encoding=stick_breaking", "encoding@encoding.inner=sink"))


@pytest.mark.parametrize("name", ["fox", "ssmax", "sink", "stick_breaking"])
def test_linear_attention_refuses_a_mechanism_that_needs_the_score_matrix(name):
    with pytest.raises(UserError, match="model.attention=linear"):
        build_model(config(f"encoding={name}", "model.attention=linear"), vocab_size=V)


# --- FoX --------------------------------------------------------------------------------------
@pytest.mark.parametrize("inner", ["nope", "rope"])
def test_fox_with_every_gate_open_is_the_encoding_it_wraps(inner):
    """f_t = 1 for every t: D_ij = Σ log f_t = 0, so FoX is NoPE (the paper's FoX) or RoPE."""
    fox = model_of("encoding=fox", f"encoding@encoding.inner={inner}")
    with torch.no_grad():
        fox.encoding.gate_weight.zero_()
        fox.encoding.gate_bias.fill_(1e4)  # log σ(1e4·scale) is exactly 0 in floating point
    plain = same_weights(fox, model_of(f"encoding={inner}"))
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(fox(x)[0], plain(x)[0])
        torch.testing.assert_close(fox(x, doc=DOC)[0], plain(x, doc=DOC)[0])


def test_fox_decay_is_the_sum_of_log_gates_since_the_key_and_never_grows_with_distance():
    """D_ij = Σ_{t=j+1..i} log σ(w·x_t + b), summed here token by token; it is <= 0 and
    non-increasing as the key moves back (j decreasing), per head, for any input."""
    fox = build_encoding(config("encoding=fox")).double()
    with torch.no_grad():
        fox.gate_weight.normal_(std=0.3)
        fox.gate_bias.normal_(std=0.3)
    x = torch.randn(B, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    c = fox.decay(Context.arange(T, dtype=torch.float64).with_input(x), layer=1)  # (B, H, T)
    w, b = fox.gate_weight[1], fox.bias_scale * fox.gate_bias[1]  # (H, d), (H,)
    log_f = torch.log(torch.sigmoid(torch.einsum("btd,hd->bht", x, w) + b[None, :, None]))
    D = c[..., :, None] - c[..., None, :]
    for i, j in [(5, 5), (5, 4), (9, 2), (T - 1, 0)]:
        torch.testing.assert_close(D[..., i, j], log_f[..., j + 1:i + 1].sum(-1))
    past = causal(T)[0, 0]
    assert (D[..., past] <= 0).all()
    assert (D[..., 1:, :-1] <= D[..., 1:, 1:] + 1e-12)[..., past[1:, 1:]].all()  # D_i,j-1 <= D_i,j


def test_fox_gates_come_from_the_tokens():
    """Data-dependent: the decays of a layer change when the input changes, unlike ALiBi's."""
    fox = build_encoding(config("encoding=fox")).double()
    ctx = Context.arange(T, dtype=torch.float64)
    x = torch.randn(1, T, 32, dtype=torch.float64)
    assert not torch.allclose(fox.decay(ctx.with_input(x)), fox.decay(ctx.with_input(x.flip(1))))


# --- stick-breaking ---------------------------------------------------------------------------
def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_stick_breaking_is_the_papers_recursion_on_a_hand_computed_case():
    """Query 3 with β = 0.2, 0.5, 0.75 on keys 0, 1, 2: key 2 takes 0.75 of the stick, key 1
    0.5 of the 0.25 left, key 0 0.2 of the 0.125 left; the 0.1 remaining goes to the query."""
    encoding = build_encoding(config("encoding=stick_breaking"))
    scores = torch.full((1, 1, 4, 4), float("-inf"), dtype=torch.float64)
    scores[0, 0, 3, :3] = torch.tensor([logit(0.2), logit(0.5), logit(0.75)])
    scores[0, 0, 3, 3] = 5.0  # the query's own logit takes no part in the stick
    w = encoding.normalise(scores, torch.arange(4), torch.arange(4))[0, 0, 3]
    torch.testing.assert_close(w, torch.tensor([0.025, 0.125, 0.75, 0.1], dtype=torch.float64))


def test_stick_breaking_weights_sum_to_at_most_one_and_favour_the_nearest_keys():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(B, H, T, T, generator=g, dtype=torch.float64) * 3
    stick = causal(T)[0, 0].tril(-1)  # keys j < i
    A = stick_breaking_weights(scores.masked_fill(~causal(T), float("-inf")), stick)
    assert (A.sum(-1) <= 1 + 1e-12).all() and (A >= 0).all() and (A[..., ~stick] == 0).all()
    # equal logits everywhere: A_ij = β(1 - β)^(i-j-1), recency with no position encoding
    A = stick_breaking_weights(torch.zeros(1, 1, T, T, dtype=torch.float64), stick)[0, 0, T - 1, : T - 1]
    torch.testing.assert_close(A, 0.5 * 0.5 ** torch.arange(T - 2, -1, -1, dtype=torch.float64))


def test_a_hidden_key_takes_nothing_and_leaves_the_stick_whole():
    """β = σ(-inf) = 0 for another document's key: the weights of the others are as if it were absent."""
    encoding = build_encoding(config("encoding=stick_breaking"))
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(1, 1, 6, 6, generator=g, dtype=torch.float64).masked_fill(~causal(6), float("-inf"))
    hidden = scores.clone()
    hidden[..., 5, 2] = float("-inf")
    idx = torch.arange(6)
    full, without = encoding.normalise(scores, idx, idx), encoding.normalise(hidden, idx, idx)
    keep = torch.tensor([0, 1, 3, 4, 5])
    expected = encoding.normalise(scores[..., keep][..., keep, :], torch.arange(5), torch.arange(5))
    torch.testing.assert_close(without[..., 5, keep], expected[..., 4, :])
    assert without[..., 5, 2] == 0 and not torch.allclose(full, without)


# --- SSMax ------------------------------------------------------------------------------------
MASKS = [(None, Window()), (DOC, Window()), (None, Window(5)), (DOC, Window(5)), (DOC, Window(4, chunked=True))]


@pytest.mark.parametrize(("doc", "window"), MASKS, ids=["causal", "documents", "sliding", "documents+sliding",
                                                        "documents+chunk"])
def test_visible_keys_count_what_the_mask_shows(doc, window):
    mask = AttentionMask(T, doc, window)
    assert torch.equal(mask.visible_keys(), mask.visible().sum(-1)[:, 0])


def ssmax_attention(s: float, doc=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of SSMax around NoPE with every s_h = s, and of NoPE itself, on the same q, k, v."""
    encoding = build_encoding(config("encoding=ssmax", "encoding@encoding.inner=nope")).double()
    with torch.no_grad():
        encoding.s.fill_(s)
    mask = AttentionMask(T, doc)
    ctx = Context.arange(T, dtype=torch.float64, doc=doc, masks=(mask,))
    q, k, v = qkv()
    sq, sk, terms = attention.encode(encoding, q, k, ctx, 0)
    out = attention.attend(sq, sk, v, attention.plan(encoding, ctx, 0, 0.0, KernelPolicy()), terms=terms)
    return out, attention.attend(q, k, v, attention.plan(encoding.inner, ctx, 0, 0.0, KernelPolicy()))


def test_ssmax_is_softmax_where_s_log_n_is_one():
    """s = 1/ln n: the query that sees n keys attends exactly as softmax does, the others do not;
    under documents n counts the keys of the query's document (the last of the 10-token one)."""
    out, plain = ssmax_attention(1 / math.log(T))
    torch.testing.assert_close(out[..., T - 1, :], plain[..., T - 1, :])
    assert not torch.allclose(out[..., T - 2, :], plain[..., T - 2, :])
    out, plain = ssmax_attention(1 / math.log(10), DOC)
    torch.testing.assert_close(out[0, :, 16], plain[0, :, 16])


def test_ssmax_lowers_attention_entropy_as_s_grows():
    """The paper's point: a larger s·log n keeps attention peaked; entropy falls with s."""
    encoding = build_encoding(config("encoding=ssmax", "encoding@encoding.inner=nope")).double()
    ctx = Context.arange(T, dtype=torch.float64)
    q, k, _ = qkv()
    entropies = []
    for s in (0.1, 0.3, 1.0, 3.0):
        with torch.no_grad():
            encoding.s.fill_(s)
        sq, sk, terms = attention.encode(encoding, q, k, ctx, 0)
        p = attention.explicit_weights(sq, sk, causal(T), terms)[..., 1:, :]  # queries that see >= 2 keys
        entropies.append(float(-(p * p.clamp_min(1e-300).log()).sum(-1).mean().detach()))
    assert entropies == sorted(entropies, reverse=True) and entropies[0] > entropies[-1] + 0.5, entropies


# --- sinks ------------------------------------------------------------------------------------
def test_a_sink_at_minus_infinity_is_plain_attention(monkeypatch):
    encoding = build_encoding(config("encoding=sink")).double()
    with torch.no_grad():
        encoding.sink.fill_(float("-inf"))
    encoding.prepare(T)
    ctx = Context.arange(T, dtype=torch.float64)
    q, k, v = qkv()
    q, k, terms = attention.encode(encoding, q, k, ctx, 0)
    plain = reference(q, k, v, causal(T))
    torch.testing.assert_close(attention.attend(q, k, v, attention.plan(encoding, ctx, 0, 0.0, KernelPolicy()), terms=terms),
                               plain)
    monkeypatch.setattr(explicit_mask, "DENSE_MAX_LEN", 0)
    monkeypatch.setattr(explicit_mask, "QUERY_CHUNK", 5)
    torch.testing.assert_close(attention.attend(q, k, v, attention.plan(encoding, ctx, 0, 0.0, KernelPolicy()), terms=terms),
                               plain)


def test_a_sink_takes_its_share_of_the_denominator():
    """All logits 0, sink logit s: the i-th query's n = i + 1 keys keep n / (n + e^s) of the weight."""
    encoding = build_encoding(config("encoding=sink", "encoding@encoding.inner=nope")).double()
    with torch.no_grad():
        encoding.sink.fill_(math.log(3) / encoding.scale)  # e^s = 3
    q, k, _ = (torch.zeros_like(t) for t in qkv())
    _, _, terms = attention.encode(encoding, q, k, Context.arange(T, dtype=torch.float64), 0)
    total = attention.explicit_weights(q, k, causal(T), terms).sum(-1)  # (B, H, T)
    n = torch.arange(1, T + 1, dtype=torch.float64)
    torch.testing.assert_close(total, (n / (n + 3)).expand(B, H, T))


def test_a_sink_with_minus_infinity_logit_leaves_the_model_as_the_encoding_it_wraps():
    sink = model_of("encoding=sink")
    with torch.no_grad():
        sink.encoding.sink.fill_(float("-inf"))
    plain = same_weights(sink, model_of("encoding=rope"))
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(sink(x, doc=DOC)[0], plain(x, doc=DOC)[0])


# --- the FlexAttention forms, eagerly on CPU (forward) ----------------------------------------
@pytest.mark.parametrize("name", ["fox", "sink", "fox_alibi", "pope"])
@pytest.mark.parametrize("documents", [False, True])
def test_flex_forms_of_decays_and_sinks_equal_the_reference(name, documents, monkeypatch):
    """What CUDA runs: the decays as a score_mod over the captured c, the sink through the
    log-sum-exp, PoPE's 2d-wide q, k against d-wide values; here with FlexAttention's eager
    forward in place of the compiled kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(flex, "compiled_flex_attention", lambda: flex_attention)
    overrides = ("encoding=fox", "encoding@encoding.inner=alibi") if name == "fox_alibi" else (f"encoding={name}",)
    encoding = build_encoding(config(*overrides)).double()
    with torch.no_grad():
        for p in encoding.parameters():
            p.normal_(std=0.5)
    encoding.prepare(T)
    doc = DOC if documents else None
    mask = AttentionMask(T, doc, Window(9))
    pos = document_positions(DOC) if documents else torch.arange(T)
    ctx = Context.at(pos, torch.float64, doc, (mask,), n_positions=T)
    q, k, v = qkv(2)
    x = torch.randn(B, T, 32, dtype=torch.float64)
    bias_ctx = ctx.at_indices() if documents and encoding.offers("distance_bias") else ctx
    plan = flex.FlexPlan(encoding.score_mod(bias_ctx) if encoding.offers("position_bias") else None,
                         mask.block_mask(torch.device("cpu")))
    with torch.no_grad(), warnings.catch_warnings():  # FlexAttention has no backward on CPU
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is slow: it is a check
        q, k, terms = attention.encode(encoding, q, k, ctx.with_input(x), 0)
        out = attention.attend(q, k, v, plan, terms=terms)
    extra = encoding.position_bias(pos, pos) if encoding.offers("position_bias") else None
    torch.testing.assert_close(out, reference(q, k, v, mask.visible(), extra, terms))


def test_stick_breaking_falls_back_from_flex_attention_with_one_warning(monkeypatch):
    """Without fla's stick-breaking kernel (tests/test_fla_attention.py), CUDA writes the weights out."""
    monkeypatch.setattr(errors, "_WARNED", set())
    monkeypatch.setattr(attention, "fused_plan", lambda *args: None)
    monkeypatch.setattr(Context, "device", property(lambda self: torch.device("cuda")))
    encoding = build_encoding(config("encoding=stick_breaking", "model.d_model=64"))  # head_dim 16: flex could run
    with pytest.warns(RuntimeWarning, match="stick_breaking.*replaces softmax"):
        chosen = attention.plan(encoding, Context.arange(T), 0, 0.0, KernelPolicy())
    assert isinstance(chosen, attention.DensePlan)


# --- PoPE -------------------------------------------------------------------------------------
def pope_scores(encoding, q, k, pos) -> torch.Tensor:
    """What attention computes from PoPE's q̃, k̃: q̃·k̃ / √(2d)."""
    tq, tk = encoding.transform_qk(q, k, Context.at(pos, torch.float64, n_positions=int(pos.max()) + 1))
    return tq @ tk.transpose(-1, -2) / math.sqrt(tq.shape[-1])


@pytest.fixture
def pope():
    encoding = build_encoding(config("encoding=pope", "encoding.base=100")).double()
    with torch.no_grad():
        encoding.delta.uniform_(-2 * math.pi, 0.0)
    return encoding


def test_pope_scores_are_the_papers_sum(pope):
    """a_mn = Σ_c softplus(q_c) softplus(k_c) cos((n - m)θ_c + δ_c) / √d, θ_c = base^(-c/d)."""
    q, k, _ = qkv(3)
    pos = torch.arange(T)
    theta = 100.0 ** -(torch.arange(HD, dtype=torch.float64) / HD)
    rel = (pos[None, :] - pos[:, None]).double()  # (m, n): n - m
    mu_q, mu_k = torch.nn.functional.softplus(q), torch.nn.functional.softplus(k)  # (B, H, T, d)
    phase = rel[None, None, :, :, None] * theta + pope.delta[None, :, None, None, :]  # (1, H, m, n, d)
    expected = (mu_q[:, :, :, None, :] * mu_k[:, :, None, :, :] * phase.cos()).sum(-1) / math.sqrt(HD)
    torch.testing.assert_close(pope_scores(pope, q, k, pos), expected, atol=1e-6, rtol=1e-5)  # θ in fp32, as RoPE's


def test_pope_scores_depend_on_positions_only_through_m_minus_n(pope):
    q, k, _ = qkv(4)
    pos = torch.arange(T)
    torch.testing.assert_close(pope_scores(pope, q, k, pos + 37), pope_scores(pope, q, k, pos))
    per_sequence = torch.stack((pos + 5, pos + 300))  # (B, T): any offset per sequence
    torch.testing.assert_close(pope_scores(pope, q, k, per_sequence), pope_scores(pope, q, k, pos))
    assert not torch.allclose(pope_scores(pope, q, k, pos * 2), pope_scores(pope, q, k, pos))


def test_pope_keeps_its_phase_offset_in_its_range_as_the_same_phase(pope):
    """δ lies in the paper's [-2π, 0] whatever the parameter's value, and the scores are those of the
    parameter's own value: δ is a phase, wrapped into the range rather than clamped to it."""
    q, k, _ = qkv(5)
    pos = torch.arange(T)
    for raw in (0.0, 3.0, -9.0, 20.0):
        with torch.no_grad():
            pope.delta.uniform_(-1.0, 1.0).add_(raw)
        offset = pope.phase_offset()
        assert ((offset > -2 * math.pi) & (offset <= 0)).all(), raw
        torch.testing.assert_close(offset.cos(), pope.delta.cos())
        torch.testing.assert_close(offset.sin(), pope.delta.sin())
    assert (build_encoding(config("encoding=pope")).phase_offset() == 0).all()  # the zero-offset start


@pytest.mark.parametrize("start", ["init", "above 0", "below -2pi"])
def test_pope_phase_offset_learns_from_its_start_and_past_either_end(start):
    """Every phase offset receives the scores' gradient with respect to it: at its zero start (the
    end of its range: a clamp there gives 0 on torch >= 2.15, 1 before) and after a step has carried it
    past either end (a clamp gives 0 there on every torch, so the offset would never move again)."""
    encoding = build_encoding(config("encoding=pope", "model.d_model=512", "model.n_head=4")).double()  # head_dim 128
    shift = {"init": 0.0, "above 0": 0.3, "below -2pi": -2 * math.pi - 0.3}[start]
    with torch.no_grad():
        encoding.delta.add_(shift)
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(1, 4, 64, 128, generator=g, dtype=torch.float64) for _ in range(2))
    weights = torch.randn(1, 4, 64, 64, generator=g, dtype=torch.float64)
    pos = torch.arange(64)
    (pope_scores(encoding, q, k, pos) * weights).sum().backward()

    # the same scores with the offset a plain leaf at the parameter's value: its gradient is the score's
    delta = encoding.delta.detach().clone().requires_grad_()
    encoding.phase_offset = lambda: delta
    (pope_scores(encoding, q, k, pos) * weights).sum().backward()
    assert delta.grad.abs().min() > 0
    torch.testing.assert_close(encoding.delta.grad, delta.grad)


