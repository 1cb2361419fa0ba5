"""PaTH (Yang et al., NeurIPS 2025): logits q_iᵀ H_i···H_{j+1} k_j with H_t = I − β_t w_t w_tᵀ, pinned
to the paper's definition written out as explicit matrix products, to its special cases (β = 0 is
NoPE, β = 2 with unit w is a reflection), and to flash-linear-attention's reference implementation.

Every attention path with document and window masks, causality in every flavour and "a packed
document is computed as the document alone" run over every encoding, PaTH included, in
test_attention_paths.py, test_masks.py, test_flavors.py and test_model.py.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from fla_reference import fla_naive

from posenc.build import build_encoding, build_model
from posenc.config import compose
from posenc.errors import UserError
from posenc.nn import attention
from posenc.nn import dense as explicit_mask
from posenc.nn.encodings import householder
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.householder import PathScores
from posenc.nn.encodings.path import short_convolution
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


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


def random_transforms(seed: int, shape: tuple[int, ...], d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit w (shape, d) and β in (0, 2) (shape)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.functional.normalize(torch.randn(*shape, d, generator=g, dtype=torch.float64), dim=-1)
    return w, 2 * torch.rand(*shape, generator=g, dtype=torch.float64)


def papers_scores(q, k, w, beta) -> torch.Tensor:
    """s_ij = q_iᵀ (Π_{t=j+1..i} H_t) k_j, H_t = I − β_t w_t w_tᵀ, the later transform on the left,
    every product an explicit d x d matrix; 0 where j > i. q, k, w (B, H, T, d), β (B, H, T)."""
    *lead, n, d = q.shape
    s = torch.zeros(*lead, n, n, dtype=q.dtype)
    for idx in torch.cartesian_prod(*(torch.arange(m) for m in lead)).reshape(-1, len(lead)).tolist():
        Hs = [torch.eye(d, dtype=q.dtype) - beta[(*idx, t)] * torch.outer(w[(*idx, t)], w[(*idx, t)]) for t in range(n)]
        for i in range(n):
            for j in range(i + 1):
                product = torch.eye(d, dtype=q.dtype)
                for t in range(j + 1, i + 1):
                    product = Hs[t] @ product
                s[(*idx, i, j)] = q[(*idx, i)] @ product @ k[(*idx, j)]
    return s


# --- the chunked algorithm against the definition ----------------------------------------------
@pytest.mark.parametrize("chunk", [3, 4, 13, 64])
def test_chunked_scores_are_the_papers_products_of_householder_transforms(chunk):
    """The UT form over chunks (3 and 4 do not divide T = 13; 64 is one chunk) equals the explicit
    products, for the whole matrix and for any block of queries over keys from any lo."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 13, 5, generator=g, dtype=torch.float64) for _ in range(2))
    w, beta = random_transforms(1, (2, 2, 13), 5)
    expected = papers_scores(q, k, w, beta)
    scores = PathScores(q, k, w, beta, chunk)
    torch.testing.assert_close(scores.rows(0, 13, 0), expected)
    for start, end, lo in [(4, 9, 2), (8, 13, 0), (12, 13, 12), (5, 11, 5)]:
        torch.testing.assert_close(scores.rows(start, end, lo), expected[..., start:end, lo:end])


@pytest.mark.parametrize("C", [1, 5, 8, 13])
def test_the_chunks_unit_lower_inverse_is_the_inverse(C):
    g = torch.Generator().manual_seed(C)
    system = torch.randn(3, C, C, generator=g, dtype=torch.float64).tril(-1) + torch.eye(C, dtype=torch.float64)
    torch.testing.assert_close(householder.unit_lower_inverse(system), torch.linalg.inv(system))


def test_with_beta_zero_every_transform_is_the_identity_and_path_is_nope():
    """β = 0: H_t = I, so s_ij = q_i·k_j; and a model whose β are all 0 is the NoPE model."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 10, 4, generator=g, dtype=torch.float64) for _ in range(2))
    w, _ = random_transforms(1, (1, 2, 10), 4)
    scores = PathScores(q, k, w, torch.zeros(1, 2, 10, dtype=torch.float64), chunk=4).rows(0, 10, 0)
    torch.testing.assert_close(scores, (q @ k.transpose(-1, -2)).tril())
    path, nope = model_of("encoding=path"), model_of("encoding=nope")
    with torch.no_grad():
        path.encoding.beta_weight.zero_()
        path.encoding.beta_bias.fill_(-1e4)  # β = 2σ(-1e4·scale): exactly 0 in floating point
    nope.load_state_dict({k: v for k, v in path.state_dict().items() if not k.startswith("encoding.")})
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(path(x)[0], nope(x)[0])
        torch.testing.assert_close(path(x, doc=DOC)[0], nope(x, doc=DOC)[0])


def test_reflections_preserve_the_keys_norm():
    """β = 2 and |w| = 1: every H_t is a Householder reflection, orthogonal, so the key carried to
    query i, P_ij k_j, has the key's norm: its coordinates are the scores of the basis vectors."""
    d, n = 6, 11
    w, _ = random_transforms(2, (1, 1, n), d)
    k = torch.randn(1, 1, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q = torch.eye(d, dtype=torch.float64)[:, None, None, :].expand(d, 1, n, d)  # batch b: every query is e_b
    carried = PathScores(q, k.expand(d, 1, n, d), w.expand(d, 1, n, d), torch.full((d, 1, n), 2.0,
                                                                                    dtype=torch.float64),
                         chunk=4).rows(0, n, 0)  # (d, 1, n, n): coordinate b of P_ij k_j
    norms = carried.pow(2).sum(0).sqrt()[0]  # (n, n)
    past = torch.ones(n, n, dtype=torch.bool).tril()
    torch.testing.assert_close(norms[past], k[0, 0].norm(dim=-1).expand(n, n)[past])
    assert not torch.allclose(carried[:, 0, n - 1, 0], k[0, 0, 0])  # the key did move


# --- the encoding --------------------------------------------------------------------------------
def test_path_computes_unit_w_and_beta_in_zero_two_from_the_tokens():
    """w_t per head of unit length, β_t = 2σ(·) in (0, 2), both functions of the block's input."""
    path = build_encoding(config("encoding=path")).double()
    x = torch.randn(B, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w, beta = path.householder_vectors(x, None, layer=1)
    assert w.shape == (B, H, T, HD) and beta.shape == (B, H, T)
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(B, H, T, dtype=torch.float64))
    assert ((beta > 0) & (beta < 2)).all()
    w2, beta2 = path.householder_vectors(x.flip(1), None, layer=1)
    assert not torch.allclose(w2.flip(2), w)  # the short convolution sees the previous tokens


def test_path_scores_in_the_model_are_the_papers_products():
    """The hook's scores are the definition's, for the encoding's own w and β of this layer."""
    path = build_encoding(config("encoding=path")).double()
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(B, H, 9, HD, generator=g, dtype=torch.float64) for _ in range(2))
    x = torch.randn(B, 9, 32, generator=g, dtype=torch.float64)
    rows = path.qk_scores(q, k, Context.arange(9, dtype=torch.float64).with_input(x), layer=0)
    w, beta = path.householder_vectors(x, None, 0)
    torch.testing.assert_close(rows(0, 9, 0), papers_scores(q, k, w, beta))


def test_the_short_convolution_is_causal_and_restarts_at_every_document():
    g = torch.Generator().manual_seed(0)
    u, taps = torch.randn(2, T, 6, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    packed = short_convolution(u, taps, DOC)
    for b, (first, end) in [(0, (7, 17)), (0, (17, 24)), (1, (15, 24))]:  # each document, computed alone
        torch.testing.assert_close(packed[b, first:end], short_convolution(u[b:b + 1, first:end], taps, None)[0])
    changed = u.clone()
    changed[:, 10] += 1.0
    torch.testing.assert_close(short_convolution(changed, taps, None)[:, :10], short_convolution(u, taps, None)[:, :10])


def test_long_evaluation_in_query_blocks_equals_the_dense_form(monkeypatch):
    """Far beyond the training length attention asks for blocks of queries (here 7 rows, chunks
    of 5 tokens, neither dividing T): the model's logits are the dense form's."""
    model, x = model_of("encoding=path_fox"), tokens(1)
    with torch.no_grad():
        dense = model(x)[0], model(x, doc=DOC)[0]
        monkeypatch.setattr(explicit_mask, "DENSE_MAX_LEN", 0)
        monkeypatch.setattr(explicit_mask, "QUERY_CHUNK", 7)
        monkeypatch.setattr(householder, "CHUNK", 5)
        torch.testing.assert_close(model(x)[0], dense[0])
        torch.testing.assert_close(model(x, doc=DOC)[0], dense[1])


def test_gradients_reach_every_parameter_of_the_transforms():
    model = model_of("encoding=path").train()
    _, loss = model(tokens(), tokens(1))
    loss.backward()
    for name in ("w_down", "w_up", "conv", "beta_weight", "beta_bias"):
        grad = getattr(model.encoding, name).grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_path_fox_is_path_plus_foxs_decay():
    """PaTH-FoX: FoX's decays c_i − c_j added to PaTH's scores/√d; with every gate open it is PaTH."""
    fox = build_encoding(config("encoding=path_fox")).double()
    assert fox.inner.name == "path" and fox.offers("qk_scores") and fox.offers("decay")
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(B, H, T, HD, generator=g, dtype=torch.float64) for _ in range(2))
    ctx = Context.arange(T, dtype=torch.float64).with_input(torch.randn(B, T, 32, generator=g, dtype=torch.float64))
    _, _, terms = attention.encode(fox, q, k, ctx, 1)
    torch.testing.assert_close(terms.scores(0, T, 0), fox.inner.qk_scores(q, k, ctx, 1)(0, T, 0))
    log_f = fox.log_forget_gates(ctx.x, 1)
    torch.testing.assert_close(terms.decay, log_f.cumsum(-1))
    path_fox, path = model_of("encoding=path_fox"), model_of("encoding=path")
    with torch.no_grad():
        path_fox.encoding.gate_weight.zero_()
        path_fox.encoding.gate_bias.fill_(1e4)  # log σ(1e4·scale) is exactly 0
    state = {k.replace("encoding.inner.", "encoding."): v for k, v in path_fox.state_dict().items()
             if not k.startswith("encoding.gate_")}
    path.load_state_dict(state)
    x = tokens(2)
    with torch.no_grad():
        torch.testing.assert_close(path_fox(x)[0], path(x)[0])


@pytest.mark.parametrize("name", ["path", "path_fox"])
def test_linear_attention_refuses_path(name):
    with pytest.raises(UserError, match="model.attention=linear"):
        build_model(config(f"encoding={name}", "model.attention=linear"), vocab_size=V)


def test_path_refuses_an_inner_encoding_with_scores_of_its_own():
    with pytest.raises(UserError, match="replaces q·k"):
        build_encoding(config("encoding=path", "encoding@encoding.inner=path"))


# --- parity with flash-linear-attention's reference ----------------------------------------------
@pytest.mark.parametrize("name", ["path", "path_fox"])
def test_attention_equals_flash_linear_attentions_reference(name):
    """The layer's attention for the encoding's own w, β (and FoX's gates) equals fla's naive_path_attn
    (float32 inside, chunks of 16 there, of 64 here). fla's kernel adds the gates before its 1/√d:
    its g is FoX's log f_t·√d."""
    naive = fla_naive("path_attn/naive.py").naive_path_attn
    encoding = build_encoding(config(f"encoding={name}")).double()
    path = encoding if name == "path" else encoding.inner
    g = torch.Generator().manual_seed(5)
    n = 37
    q, k, v = (torch.randn(B, H, n, HD, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(B, n, 32, generator=g, dtype=torch.float64)
    ctx = Context.arange(n, dtype=torch.float64).with_input(x)
    q, k, terms = attention.encode(encoding, q, k, ctx, 0)
    ours = attention.attend(q, k, v, attention.plan(encoding, ctx, 0, 0.0, KernelPolicy()), terms=terms)
    w, beta = path.householder_vectors(x, None, 0)
    log_f = encoding.log_forget_gates(x, 0) if name == "path_fox" else torch.zeros(B, H, n, dtype=torch.float64)
    bthd = [t.transpose(1, 2) for t in (q, k, v, w)]  # fla's (B, T, H, d)
    theirs = naive(*bthd, beta.transpose(1, 2), log_f.transpose(1, 2) * math.sqrt(HD), HD ** -0.5, chunk_size=16)
    torch.testing.assert_close(ours, theirs.transpose(1, 2).double(), atol=2e-5, rtol=2e-5)
