"""FIRE: Functional Interpolation for Relative Positions (Li et al., ICLR 2024, eq. (4) and
the PyTorch listing of its appendix).

A learned function of a normalised distance, added to the logits:

    b_h(i, j) = f_θ( ψ(i - j) / ψ(max(L, i)) )_h,     ψ(x) = log(c·x + 1)

f_θ is an MLP 1 -> mlp_width -> H (ReLU), c > 0 and the threshold L > 0 are learned. Its output
layer has no bias, unlike the paper's listing: a bias there adds one constant per head to every
logit of every row, which softmax cancels, so it gets no gradient (``posenc check``: ~1e-16 of the
median) and changes nothing the model computes; the function class is the same without it. Its
initial values are still drawn and dropped, so that every later draw (the model's own weights)
is the one it was, and runs seeded alike start alike (the leaderboard's rows among them); a
checkpoint that holds it loads, the constant dropped. Dividing
by ψ of the *query's* position is the "progressive interpolation": every distance a query can
see maps into [0, 1], so a query far beyond the training length sees the same input range as
in training. Below the threshold (i <= L) the normaliser is the constant ψ(L) and the bias is
a function of i - j alone. Because it depends on i as well as on i - j it is not a
``distance_bias`` table.

**FlexAttention (CUDA) and its memory.** Its ``score_mod`` takes one of two forms. Without
gradients (evaluation, at any length: 16x the training length included) it computes f_θ per score
from the captured weights, a sum over hidden units: nothing of size T². But that sum indexes the
weight tensors once per hidden unit, and inductor's FlexAttention backward takes each captured
tensor that needs a gradient indexed once (docs/extending.md). So where gradients are taken
(training) the bias is first written out as a table with autograd, b_h(i, j) for every pair
j <= i < P (P = the forward's n_positions, a Python int: no host sync), and the score_mod looks it
up once, as T5's table is. The table is H·P(P+1)/2 floats, plus its gradient, and building it
keeps about mlp_width + 8 floats per pair for the backward (each hidden unit's ReLU output, ψ's
intermediates; 40 at width 32, measured in eager mode): at P = 2048, H = 12, width 32 in float32,
100 MB for the table, as much for its gradient and 340 MB for its activations per forward (one
table shared by every layer, as the bias is). T5 and ALiBi capture
O(H·P) instead; a bias that depends on i beyond i - j has no smaller exact table. Both forms equal
``position_bias`` (`posenc check`'s "bias forms" row). On CPU, training goes through SDPA with
``position_bias`` and neither form is used.

Parameters, as in the paper's listing: c = |c̃| initialised at 0.1; L = |λ · L0| with the
multiplier λ learned (initialised at 1) and L0 = 512 fixed; eps = 1e-6 keeps the ratio
finite. Where posenc deviates: one FIRE serves all layers (posenc computes a position bias
once per forward, as for T5), where the paper's main models learn one per layer.

How its parameters are scaled, and which training can reach: the MLP weights, c and λ are
O(0.1..1) numbers at PyTorch's default initialisation, so Adam's ~lr-per-step moves change
them substantially within posenc's budgets; the output is O(1) at init, so the bias acts
from the first step. c, L and f_θ are closed-form functions of every position, so nothing is
a table entry left untrained. But f_θ's *inputs*: training queries (i < T) reach
x = ψ(T - 1)/ψ(max(L, T - 1)), which is 1 only when L < T. With L above the training length
(the paper's 512 when T < 512) a longer sequence reads f_θ beyond the inputs it was trained
on, on its linear (ReLU) continuation; with L < T training covers all of [0, 1]. Measured at
T = 64 (2 layers, d = 128, 400 steps, 3 seeds) L0 = 512 gave ppl 6.04 at 64 and 6.58 at 1024,
L0 = 16 gave 5.67 and 7.78: the default keeps the paper's 512; set ``init_L`` for the other.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import Context, PositionalEncoding, ScoreMod, positions_at


class FIRE(PositionalEncoding):
    """b_h(i, j) = f_θ(ψ(i - j) / ψ(max(L, i)))_h, ψ(x) = log(c·x + 1), f_θ: 1 -> width -> H.

    Args:
        mlp_width: hidden units of f_θ (paper: 32).
        init_c: initial c (paper: 0.1).
        init_L: L0, the threshold's fixed base, L = |λ·L0| (paper: 512).
        eps: added to the normaliser (paper: 1e-6).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "fire",
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(d_model, n_head, name)
        if mlp_width < 1 or not init_c > 0 or not init_L > 0:
            raise ValueError(f"FIRE needs mlp_width >= 1, init_c > 0 and init_L > 0, got mlp_width={mlp_width}, "
                             f"init_c={init_c}, init_L={init_L}")
        self.mlp_width = int(mlp_width)
        self.eps = float(eps)
        self.mlp = nn.Sequential(nn.Linear(1, self.mlp_width), nn.ReLU(), nn.Linear(self.mlp_width, n_head))
        # no output bias (softmax cancels a per-head constant); drawn as nn.Linear draws it, then dropped,
        # so that the draws after it are unchanged (the module doc)
        self.mlp[2].register_parameter("bias", None)
        self._register_load_state_dict_pre_hook(drop_output_bias)
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        # fixed, and saved with the weights: L = |λ·L0| is part of the learned function
        self.register_buffer("init_L", torch.tensor(float(init_L)))

    @property
    def threshold(self) -> Tensor:
        """L = |λ · L0| (0-d)."""
        return (self.L_multiplier * self.init_L).abs()

    def normalized_distance(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """ψ(i - j) / (ψ(max(L, i)) + eps) for queries q_pos (..., Tq), keys k_pos (..., Tk) ->
        (..., Tq, Tk), in [0, 1] for every visible key (j <= i); the future is clamped to distance 0."""
        c = self.c.abs()
        i = q_pos.to(c.dtype)[..., :, None]  # (..., Tq, 1)
        n = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0).to(c.dtype)  # (..., Tq, Tk)
        return torch.log1p(c * n) / (torch.log1p(c * torch.maximum(i, self.threshold)) + self.eps)

    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        x = self.normalized_distance(q_pos, k_pos)  # (..., Tq, Tk)
        first, second = self.mlp[0], self.mlp[2]
        # f_θ(x)_h = Σ_u w2[h, u] · relu(w1_u · x + b1_u), one hidden unit at a time: the same sum
        # the score_mod computes, and no (Tq, Tk, width) tensor on long evaluations
        bias_shape = (self.n_head,) + (1,) * x.dim()
        out = x.new_zeros(self.n_head, *x.shape)  # (H, ..., Tq, Tk)
        for u in range(self.mlp_width):
            hidden = torch.relu(first.weight[u, 0] * x + first.bias[u])  # (..., Tq, Tk)
            out = out + second.weight[:, u].view(bias_shape) * hidden
        return out.movedim(0, -3)  # (..., H, Tq, Tk)

    def score_mod(self, ctx: Context) -> ScoreMod:
        """The bias per score inside FlexAttention. Where gradients are taken (training), a lookup
        in ``bias_table``, the one tensor captured, so that FlexAttention's compiled backward
        accepts it; without (evaluation, at any length), f_θ in closed form from the captured
        weights, with no table."""
        pos = None if ctx.default_positions else ctx.pos
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return self.table_score_mod(self.bias_table(ctx.n_positions, ctx.device), pos)
        return self.closed_form_score_mod(pos)

    def bias_table(self, n_positions: int, device: torch.device) -> Tensor:
        """b_h(i, j) for every pair j <= i < P = n_positions, row by row: (H, P(P+1)/2), pair (i, j)
        at i(i+1)/2 + j. position_bias itself, on the pairs, differentiable in every parameter."""
        i, j = torch.tril_indices(n_positions, n_positions, device=device)  # (P(P+1)/2,) each
        return self.position_bias(i[:, None], j[:, None])[..., 0, 0].T.contiguous()  # (N, H, 1, 1) -> (H, N)

    @staticmethod
    def table_score_mod(table: Tensor, pos: Tensor | None) -> ScoreMod:
        """score + table[h, i(i+1)/2 + j]: one lookup in the (H, P(P+1)/2) ``bias_table``; a future
        key (masked by the BlockMask) reads the pair (i, i), as its distance clamps to 0."""

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qi, kj = positions_at(pos, b, q_idx, kv_idx)
            return score + table[h, qi * (qi + 1) // 2 + torch.minimum(kj, qi)]

        return mod

    def closed_form_score_mod(self, pos: Tensor | None) -> ScoreMod:
        """f_θ per score, written with the captured weights (a score_mod sees scalars, so the
        MLP is its sum over hidden units): no H x T x T tensor. Each weight tensor is indexed once
        per hidden unit, which FlexAttention's compiled backward refuses: for no-gradient use."""
        first, second = self.mlp[0], self.mlp[2]
        w1, b1 = first.weight[:, 0], first.bias  # (W,), (W,)
        w2 = second.weight  # (H, W)
        c, L, eps, width = self.c.abs(), self.threshold, self.eps, self.mlp_width

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qi, kj = positions_at(pos, b, q_idx, kv_idx)
            n = (qi - kj).clamp(min=0).to(c.dtype)
            x = torch.log1p(c * n) / (torch.log1p(c * torch.maximum(qi.to(c.dtype), L)) + eps)
            out = score
            for u in range(width):  # f_θ(x)_h = Σ_u w2[h, u] · relu(w1_u · x + b1_u)
                # w2[:, u][h], not w2[h, u]: torch 2.6 and 2.7 trace that mixed index as a .item() (a data-dependent op)
                out = out + w2[:, u][h] * torch.relu(w1[u] * x + b1[u])
            return out

        return mod

    def options(self) -> dict[str, object]:
        return {"mlp_width": self.mlp_width, "init_L": float(self.init_L)}


def drop_output_bias(state: dict, prefix: str, *args: object) -> None:
    """A checkpoint made while f_θ's output layer had a bias (a per-head constant softmax cancels):
    the constant dropped, the rest loaded as it was."""
    state.pop(f"{prefix}mlp.2.bias", None)
