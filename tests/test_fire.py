"""FIRE (Li et al., ICLR 2024, eq. (4)): b_h(i, j) = f_θ(ψ(i - j) / ψ(max(L, i))), ψ(x) = log(cx + 1)."""

from __future__ import annotations

import math

import torch

from posenc.build import build_encoding
from posenc.config import compose
from posenc.nn.encodings.base import Context
from posenc.nn.encodings.fire import FIRE


def linear_fire(c: float, L: float, n_head: int = 2) -> FIRE:
    """A FIRE whose f_θ is x -> (h + 1)·x (one hidden ReLU unit, x >= 0), so b is readable."""
    enc = FIRE(d_model=8 * n_head, n_head=n_head, mlp_width=1, init_c=c, init_L=L)
    with torch.no_grad():
        enc.mlp[0].weight.fill_(1.0)
        enc.mlp[0].bias.zero_()
        enc.mlp[2].weight.copy_(torch.arange(1.0, n_head + 1)[:, None])
    return enc


def b(enc: FIRE, i: int, j: int) -> torch.Tensor:
    """b_h(i, j) for every head: (H,)."""
    return enc.position_bias(torch.tensor([i]), torch.tensor([j]))[:, 0, 0]


def test_bias_matches_the_formula_on_a_hand_computed_case():
    """c = 1, L = 4, f(x)_h = (h + 1)·x: b(2, 0) = ln 3 / ln 5 (i <= L: normalised by ψ(L));
    b(8, 4) = ln 5 / ln 9 and b(8, 0) = ln 9 / ln 9 = 1 (i > L: normalised by ψ(i))."""
    enc = linear_fire(c=1.0, L=4.0)
    for (i, j), x in {(2, 0): 1.098612 / 1.609438, (8, 4): 1.609438 / 2.197225, (8, 0): 1.0, (5, 5): 0.0}.items():
        torch.testing.assert_close(b(enc, i, j), torch.tensor([x, 2 * x]), atol=1e-5, rtol=1e-5)
    # and with c = 0.1, L = 2: b(10, 3) = ln(1.7) / ln(2)
    torch.testing.assert_close(b(linear_fire(0.1, 2.0), 10, 3)[0], torch.tensor(math.log(1.7) / math.log(2.0)))


def test_up_to_the_threshold_the_bias_is_a_function_of_i_minus_j_alone():
    torch.manual_seed(0)
    enc = FIRE(d_model=32, n_head=4, init_L=40.0)
    q, k = torch.arange(0, 20), torch.arange(0, 20)
    torch.testing.assert_close(enc.position_bias(q, k), enc.position_bias(q + 20, k + 20))  # every query <= L = 40


def test_beyond_the_threshold_the_query_position_enters_only_through_psi_of_i():
    """For i > L the bias is f(ψ(i - j)/ψ(i)): with c = 1, (i, i - j) = (3, 1), (15, 3), (63, 7)
    all give ln 2/ln 4 = ln 4/ln 16 = ln 8/ln 64 = 1/2, so the same bias at three different
    distances; translation no longer leaves it unchanged; the farthest key (j = 0) maps to 1
    at every query position: the progressive interpolation."""
    torch.manual_seed(0)
    enc = FIRE(d_model=32, n_head=4, init_c=1.0, init_L=2.0)
    torch.testing.assert_close(b(enc, 3, 2), b(enc, 15, 12))
    torch.testing.assert_close(b(enc, 3, 2), b(enc, 63, 56))
    assert not torch.allclose(b(enc, 20, 10), b(enc, 30, 20))
    first_key = torch.stack([b(enc, i, 0) for i in (2, 10, 100, 10_000)])
    torch.testing.assert_close(first_key, first_key[:1].expand_as(first_key))


def test_every_normalised_distance_lies_in_zero_one_at_any_length():
    torch.manual_seed(0)
    enc = FIRE(d_model=32, n_head=4, init_L=16.0)
    pos = torch.arange(1024)
    x = enc.normalized_distance(pos, pos)
    visible = pos[None, :] <= pos[:, None]
    assert x[visible].min() >= 0 and x[visible].max() <= 1


def test_training_reaches_every_input_of_a_longer_sequence_only_with_the_threshold_below_it():
    """Training queries (i < T) map their farthest key to ψ(T - 1)/ψ(max(L, T - 1)): 1 when
    L < T, so every input in [0, 1] a longer sequence produces was seen; below 1 when L > T
    (the paper's L0 = 512, the config's default, at T = 64)."""
    enc = build_encoding(compose(["encoding=fire", "trainer.seq_len=64", "model.n_head=4", "model.d_model=64"]))
    assert enc.threshold.item() == 512.0  # the paper's
    train, long = torch.arange(64), torch.arange(1024)
    assert enc.normalized_distance(train, train).max() < 0.6
    torch.testing.assert_close(enc.normalized_distance(long, long).max(), torch.tensor(1.0))
    below = FIRE(d_model=64, n_head=4, init_L=16.0)
    torch.testing.assert_close(below.normalized_distance(train, train).max(), torch.tensor(1.0))


def test_c_the_threshold_and_the_mlp_all_learn():
    torch.manual_seed(0)
    enc = FIRE(d_model=32, n_head=4, init_L=8.0)
    pos = torch.arange(32)
    (enc.position_bias(pos, pos) ** 2).sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bias_equals_the_papers_listing():
    """The appendix's PyTorch listing, written out: positions, |L_multiplier·init_L| as the
    threshold, log(|c·n| + 1) over log(|c·max(i, L)| + 1) + eps, then the MLP per (i, j)."""
    torch.manual_seed(0)
    enc = FIRE(d_model=32, n_head=4, init_L=12.0)
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.5)  # any parameters, negative c and multiplier included
    positions = torch.arange(40, dtype=torch.float)
    rel_distance = positions[:, None] - positions[None, :]
    threshold = torch.abs(enc.L_multiplier * enc.init_L)
    pos_normalizer = torch.max(positions, threshold)[:, None]
    rel_distance = torch.log(torch.abs(enc.c * rel_distance) + 1)
    pos_normalizer = torch.log(torch.abs(enc.c * pos_normalizer) + 1) + 1e-6
    expected = enc.mlp((rel_distance / pos_normalizer)[..., None]).permute(2, 0, 1)  # (H, T, T)
    visible = torch.ones(40, 40, dtype=torch.bool).tril().expand(4, 40, 40)
    pos = torch.arange(40)
    torch.testing.assert_close(enc.position_bias(pos, pos)[visible], expected[visible], atol=1e-5, rtol=1e-5)


def scores_from(mod, n_head: int, T: int) -> torch.Tensor:
    """score_mod(0, 0, h, i, j) for every head and pair, vectorised as FlexAttention's vmap does: (H, T, T)."""
    h, i, j = torch.arange(n_head)[:, None, None], torch.arange(T)[None, :, None], torch.arange(T)[None, None, :]
    return mod(torch.zeros(n_head, T, T, dtype=torch.float64), torch.tensor(0), h, i, j)


def test_in_training_the_score_mod_looks_up_one_table_and_every_parameter_gets_position_bias_s_gradient():
    """Where gradients are taken, FlexAttention gets the bias as one (H, P(P+1)/2) table, the one
    tensor its compiled backward can differentiate (tests/test_score_mod_rule.py), and the gradient
    that reaches c, λ and the MLP through it is the gradient through position_bias, beyond the
    threshold (L = 12 < T = 40) too."""
    torch.manual_seed(0)
    enc = FIRE(d_model=64, n_head=4, init_L=12.0).double()
    T = 40
    visible = torch.ones(T, T, dtype=torch.bool).tril().expand(4, T, T)
    weights = torch.randn(4, T, T, dtype=torch.float64)  # any function of the bias on visible pairs
    grads = []
    for bias in (lambda: scores_from(enc.score_mod(Context.arange(T, dtype=torch.float64)), 4, T),
                 lambda: enc.position_bias(torch.arange(T), torch.arange(T))):
        enc.zero_grad()
        (bias()[visible] * weights[visible]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters()})
    mod = enc.score_mod(Context.arange(T, dtype=torch.float64))
    tensors = [c.cell_contents for c in mod.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
    assert [t.shape for t in tensors if t.requires_grad] == [(4, T * (T + 1) // 2)]
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[0][name], g, rtol=1e-12, atol=1e-12, msg=name)


def test_without_gradients_the_score_mod_holds_nothing_that_grows_with_the_length():
    """Evaluation at 16x a training length of 2048: the closed form, f_θ per score from the captured
    weights; no table (at P = 32768 one would hold 2·10⁹ entries per head)."""
    enc = FIRE(d_model=64, n_head=4)
    with torch.no_grad():
        mod = enc.score_mod(Context.arange(16 * 2048))
    captured = [c.cell_contents for c in mod.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
    assert captured and max(t.numel() for t in captured) <= enc.n_head * enc.mlp_width
    with torch.no_grad():
        torch.testing.assert_close(scores_from(mod, 4, 40).float(), enc.position_bias(torch.arange(40), torch.arange(40)),
                                   rtol=1e-5, atol=1e-5)


def test_its_mlp_adds_no_per_head_constant_and_older_checkpoints_still_load():
    """f_θ's output layer has no bias (softmax cancels a per-head constant on every logit of a row,
    so it never learns): the parameters are the paper's but that one; the weights draw the same
    initial values as with it (the model's own after them too); a state dict that holds the bias loads,
    computing the same attention (the constant only shifts every logit of a row)."""
    torch.manual_seed(0)
    enc = FIRE(d_model=32, n_head=4)
    assert enc.mlp[2].bias is None and "mlp.2.bias" not in dict(enc.named_parameters())
    after = torch.rand(3)
    torch.manual_seed(0)
    with_bias = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    torch.testing.assert_close(torch.rand(3), after)  # as many draws as before: what follows is unchanged
    torch.testing.assert_close(enc.mlp[2].weight, with_bias[2].weight)
    old = {**enc.state_dict(), "mlp.2.bias": torch.ones(4)}
    fresh = FIRE(d_model=32, n_head=4)
    fresh.load_state_dict(old)
    pos = torch.arange(12)
    torch.testing.assert_close(fresh.position_bias(pos, pos), enc.position_bias(pos, pos))
