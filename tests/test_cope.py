"""CoPE (Golovneva et al., 2024): positions count the keys the gates let through, and the
attention is the paper's softmax(q·k/√d + q·e[p]) with e interpolated at fractional p."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.build import build_encoding, build_model
from posenc.config import compose
from posenc.nn import attention
from posenc.nn.encodings import cope as cope_module
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.cope import CoPE, contextual_positions


def causal(T: int) -> torch.Tensor:
    return torch.ones(T, T).tril()


def test_with_every_gate_open_the_position_of_key_j_for_query_i_is_i_minus_j_plus_one():
    p = contextual_positions(causal(5))
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    assert torch.equal(p, torch.where(j <= i, i - j + 1, 0).float())


def test_with_gates_open_on_some_keys_positions_count_those_keys():
    """Only keys 1 and 4 are gated in: p_ij = how many of them lie in [j, i]."""
    gates = torch.zeros(6, 6)
    gates[:, [1, 4]] = 1.0
    gates = gates * causal(6)
    expected = torch.tensor([
        [0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [2, 2, 1, 1, 1, 0],
        [2, 2, 1, 1, 1, 0],
    ], dtype=torch.float32)
    assert torch.equal(contextual_positions(gates), expected)


def forced_gates_qk(T: int, counted: list[int], head_dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k whose gates are σ(±50) = 1 or 0 (to float32 precision): keys in ``counted`` open."""
    u = torch.zeros(head_dim)
    u[0] = 1.0
    q = (100.0 * u).expand(1, 1, T, head_dim).clone()  # q·k/√d = ±100/2 = ±50
    sign = torch.tensor([1.0 if t in counted else -1.0 for t in range(T)])
    k = (sign[:, None] * u).expand(1, 1, T, head_dim).clone()
    return q, k


@pytest.mark.parametrize(("counted", "npos_max"), [(list(range(6)), 8), (list(range(6)), 4), ([1, 4], 8)])
def test_the_module_adds_q_dot_e_at_the_count_of_gated_keys(counted, npos_max):
    """Through content_bias with gates forced open or shut: bias_ij = q_i·e[n_ij], n_ij the number
    of open keys in [j, i] (i - j + 1 when all are open), clamped to npos_max - 1."""
    T = 6
    enc = CoPE(8, 2, n_layer=1, npos_max=npos_max)  # head_dim 4
    torch.nn.init.normal_(enc.pos_emb)
    q, k = forced_gates_qk(T, counted)
    bias = enc.content_bias(q, k, Context.arange(T))[0, 0]
    e = enc.pos_emb[0, 0]  # (head_dim, npos_max)
    for i in range(T):
        for j in range(i + 1):
            n = min(sum(1 for t in counted if j <= t <= i), npos_max - 1)
            torch.testing.assert_close(bias[i, j], q[0, 0, i] @ e[:, n], msg=f"{i},{j}")


def test_a_tiny_case_by_hand():
    """head_dim 1, two tokens: q = (1, 2), k = (0, ln 3), e = (1, 2, 4).
    Gates: g_00 = σ(0) = 1/2, g_10 = σ(0) = 1/2, g_11 = σ(2 ln 3) = 9/10.
    Positions: p_00 = 1/2, p_10 = 1/2 + 9/10 = 1.4, p_11 = 0.9.
    Bias q_i·e[p_ij]: 1·(e0 + e1)/2 = 1.5;  2·(0.6·e1 + 0.4·e2) = 5.6;  2·(0.1·e0 + 0.9·e1) = 3.8."""
    enc = CoPE(2, 2, n_layer=1, npos_max=3)  # head_dim 1, e shared by the 2 heads
    with torch.no_grad():
        enc.pos_emb.copy_(torch.tensor([1.0, 2.0, 4.0]).view(1, 1, 1, 3))
    q = torch.tensor([1.0, 2.0]).view(1, 1, 2, 1).expand(1, 2, 2, 1)
    k = torch.tensor([0.0, math.log(3)]).view(1, 1, 2, 1).expand(1, 2, 2, 1)
    bias = enc.content_bias(q, k, Context.arange(2))
    for h in range(2):
        torch.testing.assert_close(bias[0, h, 0, 0], torch.tensor(1.5))
        torch.testing.assert_close(bias[0, h, 1], torch.tensor([5.6, 3.8]))


def test_gates_use_the_scaled_logits_and_the_bias_is_added_unscaled():
    """The paper's code takes the gates from q·k/√d and adds q·e[p] to those scaled logits as is.
    head_dim 4, q = k = (a, a, a, a) with q·k = 4a² = 2 ln 3: g = σ(ln 3) = 3/4 (not σ(2 ln 3)),
    p_00 = 3/4, bias = q·(e0/4 + 3·e1/4) = a/4 + 3a = 3.25a with e0 = (1,0,0,0), e1 = (1,1,1,1)."""
    a = math.sqrt(math.log(3) / 2)
    enc = CoPE(4, 1, n_layer=1, npos_max=2)
    with torch.no_grad():
        enc.pos_emb.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]).view(1, 1, 4, 2))
    q = torch.full((1, 1, 1, 4), a)
    bias = enc.content_bias(q, q, Context.arange(1))
    torch.testing.assert_close(bias, torch.full((1, 1, 1, 1), 3.25 * a))


def paper_attention(q, k, v, e, npos_max):
    """The paper's SelfAttn and CoPE, one query and key at a time in float64:
    logits = q·k/√d (future -inf); g = σ(logits); p_ij = Σ_{t=j..i} g_it clamped to npos_max - 1;
    logits += (1 - w)·q·e[⌊p⌋] + w·q·e[⌈p⌉]; softmax; times v."""
    B, H, T, d = q.shape
    out = torch.zeros_like(v)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d) for j in range(i + 1)]
                gates = [1 / (1 + math.exp(-x)) for x in logits]
                for j in range(i + 1):
                    p = min(sum(gates[j : i + 1]), npos_max - 1)
                    lo, hi, w = math.floor(p), math.ceil(p), p - math.floor(p)
                    logits[j] += (1 - w) * float(q[b, h, i] @ e[h, :, lo]) + w * float(q[b, h, i] @ e[h, :, hi])
                a = torch.tensor(logits, dtype=torch.float64).softmax(-1)
                out[b, h, i] = a @ v[b, h, : i + 1]
    return out


@pytest.mark.parametrize("per_head", [False, True])
def test_attention_matches_the_papers_equations(per_head):
    B, H, T, d = 2, 2, 7, 4
    enc = CoPE(H * d, H, n_layer=1, npos_max=5, per_head=per_head).double()
    torch.nn.init.normal_(enc.pos_emb)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for _ in range(3))
    content = enc.content_bias(q, k, Context.arange(T, dtype=torch.float64)).double()
    out = attention.attend(q, k, v, None, terms=attention.LayerTerms(content=content))
    e = enc.pos_emb.detach()[0].expand(H, d, 5)
    torch.testing.assert_close(out, paper_attention(q, k, v, e, 5))


def test_future_keys_change_no_position_or_bias_of_the_past():
    """Gates only over keys j <= i: changing keys after i leaves row i's visible entries alone."""
    enc = CoPE(16, 2, n_layer=1, npos_max=16)
    torch.nn.init.normal_(enc.pos_emb)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 10, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g)
    changed = k.clone()
    changed[:, :, 6:] = torch.randn(1, 2, 4, 8, generator=g)
    a, b = (enc.content_bias(q, keys, Context.arange(10)) for keys in (k, changed))
    visible = causal(6).bool()
    torch.testing.assert_close(a[:, :, :6, :6][..., visible], b[:, :, :6, :6][..., visible])


def test_the_position_is_learned_through_the_gates():
    """p depends on k only through the gates, and the gradient reaches k through w = p - ⌊p⌋."""
    enc = CoPE(16, 2, n_layer=1, npos_max=16)
    torch.nn.init.normal_(enc.pos_emb)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 10, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g, requires_grad=True)
    enc.content_bias(q, k, Context.arange(10)).tril().sum().backward()
    assert k.grad.abs().sum() > 0 and torch.isfinite(k.grad).all()
    assert enc.pos_emb.grad.abs().sum() > 0


def test_query_chunks_give_the_same_bias_and_gradients(monkeypatch):
    """Long evaluation computes the bias a slice of queries at a time: the same numbers."""
    enc = CoPE(16, 2, n_layer=2, npos_max=8).double()  # float64: chunks change fp32 summation order
    torch.nn.init.normal_(enc.pos_emb)
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 2, 23, 8, generator=g, dtype=torch.float64) for _ in range(2))
    results = []
    for elements in (cope_module.CHUNK_ELEMENTS, 2 * 2 * 23 * 5):  # whole, then chunks of 5 rows
        monkeypatch.setattr(cope_module, "CHUNK_ELEMENTS", elements)
        enc.zero_grad()
        bias = enc.content_bias(q, k, Context.arange(23), layer=1)
        bias.tril().square().sum().backward()
        results.append((bias.detach(), enc.pos_emb.grad.clone()))
    torch.testing.assert_close(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])


def test_a_model_with_learned_cope_is_causal_and_bf16_autocast_keeps_fp32_positions():
    model = build_model(compose(["encoding=cope", "model.n_layer=2", "model.d_model=32", "model.n_head=4",
                                 "trainer.seq_len=16"]), vocab_size=64).eval()
    assert model.encoding.pos_emb.shape == (2, 1, 8, 16)  # (layer, shared by heads, head_dim, npos_max)
    torch.nn.init.normal_(model.encoding.pos_emb)
    idx = torch.randint(64, (2, 24), generator=torch.Generator().manual_seed(5))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
        torch.testing.assert_close(a[:, :10], b[:, :10])
        assert not torch.allclose(a[:, 10:], b[:, 10:])
        q = torch.randn(1, 4, 24, 8, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bias = model.encoding.content_bias(q, q, Context.arange(24))
        assert bias.dtype == torch.float32
        torch.testing.assert_close(bias, model.encoding.content_bias(q.float(), q.float(), Context.arange(24)))


def test_npos_max_defaults_to_the_training_length():
    enc = build_encoding(compose(["encoding=cope", "trainer.seq_len=48", "model.n_layer=3"]))
    assert enc.npos_max == 48 and enc.pos_emb.shape[0] == 3
