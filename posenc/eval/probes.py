"""Probes of a trained model from one forward pass, without touching the model.

Forward pre-hooks on each block's attention keep its input x (B, T, d, after the norm); the
attention weights are then recomputed by the layer itself (``CausalSelfAttention.weights``:
the same q, k and encoding hooks as its forward, written out with its mask, its bias, content
bias, decays, logit scale, sink and normaliser). From them:

- attention entropy H_i = -Σ_j p_ij log p_ij per layer, head and query position i (at most
  log(i+1), reached by a uniform row);
- mean attention distance D = Σ_j p_ij (i - j) per head (Vig & Belinkov, 2019);
- for rotary encodings, the mean squared norm of q and of k in each rotated pair, per layer
  and against the pair's frequency θ_i (Barbero et al., ICLR 2025: the highest frequencies
  carry positional heads, the lowest act as semantic channels);
- for position biases, per layer encoding that has one: b_h(n) against the distance n per head
  for a relative bias, rows b_h(i, i - n) at several query positions i for any other
  (``position_bias_curves``, below).

Everything returned is plain lists and numbers (JSON-ready); ``write_probe_figures`` draws PNGs
(posenc/eval/probe_figures.py, re-exported here).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.eval.probe_figures import log_buckets, write_probe_figures, write_probes  # noqa: F401 - re-exported


def attention_entropy(p: Tensor) -> Tensor:
    """p: (..., Tq, Tk) rows summing to 1 -> (..., Tq) entropy in nats (0·log 0 = 0)."""
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


def attention_distance(p: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """p: (..., Tq, Tk) -> (..., Tq): the expected distance Σ_j p_ij · (i - j)."""
    return (p * (q_pos[:, None] - k_pos[None, :]).to(p.dtype)).sum(-1)


def frequency_pairs(head_dim: int, rot_dim: int, style: str) -> Tensor:
    """(head_dim/2, 2) indices of the dimension pairs RoPE rotates together: (2i, 2i+1) when
    interleaved, (i, i + rot_dim/2) for 'half'; the unrotated tail paired as (2j, 2j+1)."""
    half = rot_dim // 2
    if style == "half":
        rotated = torch.stack((torch.arange(half), torch.arange(half) + half), dim=1)
    else:
        rotated = torch.arange(rot_dim).view(half, 2)
    tail = torch.arange(rot_dim, head_dim - (head_dim - rot_dim) % 2).view(-1, 2)
    return torch.cat((rotated, tail))


def pair_sq_norms(x: Tensor, pairs: Tensor) -> Tensor:
    """x: (..., head_dim) -> (..., n_pairs): x_a² + x_b² for each pair (a, b); over all pairs
    of an even head_dim they sum to ||x||²."""
    return x[..., pairs[:, 0]] ** 2 + x[..., pairs[:, 1]] ** 2


class _Capture:
    """Forward pre-hooks keeping each layer's attention input for one forward."""

    def __init__(self, model: nn.Module) -> None:
        self.inputs: dict[int, Tensor] = {}
        self.handles = [block.attn.register_forward_pre_hook(self._hook(i)) for i, block in enumerate(model.blocks)]

    def _hook(self, layer: int):
        def hook(module: nn.Module, args: tuple) -> None:
            self.inputs[layer] = args[0].detach()
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def capture_inputs(model: nn.Module, idx: Tensor) -> list[Tensor]:
    """One eval-mode forward of ``model`` (a posenc GPT) on idx (B, T); per layer the input of its
    attention, (B, T, C): the normed residual stream its q, k, v and encoding hooks see."""
    if any(block.attn.attention != "softmax" for block in model.blocks):
        raise ValueError("attention probes need softmax attention in every layer (model.attention=softmax and a "
                         "layout without recurrent layers, e.g. layout=uniform)")
    capture = _Capture(model)
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        capture.remove()
        model.train(was_training)
    return [capture.inputs[layer] for layer in range(len(model.blocks))]


@torch.no_grad()
def capture_qkv(model: nn.Module, idx: Tensor, inputs: list[Tensor] | None = None) -> list[Tensor]:
    """Per layer the output of its c_attn, (B, T, 3C) in float32: q, k, v before heads are split
    and before ``transform_qk``. inputs: ``capture_inputs``'s output if already taken."""
    inputs = capture_inputs(model, idx) if inputs is None else inputs
    return [block.attn.c_attn(x).float() for block, x in zip(model.blocks, inputs)]


def split_heads(qkv: Tensor, n_head: int) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, 3C) -> q, k, v each (B, H, T, hd), as CausalSelfAttention splits them."""
    return tuple(t.unflatten(-1, (n_head, -1)).transpose(1, 2) for t in qkv.chunk(3, dim=-1))


@torch.no_grad()
def attention_probabilities(model: nn.Module, idx: Tensor, inputs: list[Tensor] | None = None) -> list[Tensor]:
    """Per layer the attention weights (B, H, T, T) the model used on idx (B, T), each layer
    recomputing its own (the encoding's hooks, masked as the layer is: causal, its window).
    Rows sum to 1 under softmax; less where a sink takes a share.
    inputs: ``capture_inputs``'s output if already taken (else one forward here)."""
    ctx = model.context(idx, None, None, None)
    inputs = capture_inputs(model, idx) if inputs is None else inputs
    return [block.attn.weights(x, model.encoding.for_layer(layer), ctx, layer)
            for layer, (block, x) in enumerate(zip(model.blocks, inputs))]


@torch.no_grad()
def rotary_frequency_norms(model: nn.Module, idx: Tensor, inputs: list[Tensor] | None = None) -> dict | None:
    """For a rotary encoding (one whose ``rotary_frequencies`` hook gives θ in some layer, learned
    frequencies included), per layer the mean over batch, heads and positions of the squared
    norm of q and of k in each dimension pair (before rotation, which preserves it), with each
    pair's frequency θ_i (0 for pairs left unrotated) in the first rotary layer. None for other
    encodings."""
    rotary = [(layer, model.encoding.for_layer(layer)) for layer in range(len(model.blocks))]
    rotary = [(layer, enc, theta) for layer, enc in rotary if (theta := enc.rotary_frequencies(layer)) is not None]
    if not rotary:
        return None
    _, encoding, theta = rotary[0]
    theta = theta.detach().float().cpu()
    rotated = int((theta != 0).sum())  # pairs [0, rotated) turn: θ falls with i, unrotated pairs are last
    while getattr(encoding, "inner", None) is not None:  # a mechanism: its inner encoding pairs the dims
        encoding = encoding.inner
    qkv = capture_qkv(model, idx, inputs)
    pairs = frequency_pairs(encoding.head_dim, getattr(encoding, "rot_dim", encoding.head_dim),
                            getattr(encoding, "style", "interleaved"))
    q_norms, k_norms = [], []
    for layer, block in enumerate(model.blocks):
        q, k, _ = qkv[layer].unflatten(-1, (3, block.attn.n_head, -1)).unbind(2)  # (B, T, H, hd)
        q_norms.append(pair_sq_norms(q, pairs).mean(dim=(0, 1, 2)).tolist())
        k_norms.append(pair_sq_norms(k, pairs).mean(dim=(0, 1, 2)).tolist())
    return {"theta": theta.tolist(), "rotated_pairs": rotated, "q_sq_norm": q_norms, "k_sq_norm": k_norms}


@torch.no_grad()
def attention_probes(model: nn.Module, idx: Tensor) -> dict:
    """All probes at one length T = idx.shape[1]: JSON-ready.

    entropy[layer][head][i] and distance_by_query[layer][head][i]: averaged over the batch;
    distance[layer][head]: averaged over queries too; max_entropy[i] = log(i+1), a uniform
    row's; rotary and bias: see ``rotary_frequency_norms`` and ``position_bias_curves`` (a list, one
    entry per distinct layer encoding with a bias, or None)."""
    T = idx.shape[1]
    pos = torch.arange(T, device=idx.device)
    inputs = capture_inputs(model, idx)  # the one forward
    entropy, distance = [], []
    for p in attention_probabilities(model, idx, inputs):  # (B, H, T, T)
        entropy.append(attention_entropy(p).mean(0).cpu())  # (H, T)
        distance.append(attention_distance(p, pos, pos).mean(0).cpu())  # (H, T)
    return {
        "length": T,
        "entropy": [e.tolist() for e in entropy],
        "max_entropy": torch.log(torch.arange(1, T + 1, dtype=torch.float64)).tolist(),
        "distance_by_query": [d.tolist() for d in distance],
        "distance": [d.mean(-1).tolist() for d in distance],
        "rotary": rotary_frequency_norms(model, idx, inputs),
        "bias": position_bias_curves(model, T, idx.device),
    }


def probe_lengths(model: nn.Module, idx_by_length: dict[int, Tensor]) -> dict[str, dict]:
    """``attention_probes`` at several lengths (e.g. 1×, 2×, 4× the training length), keyed by
    str(length) so the result is JSON as is. idx_by_length: {T: (B, T) token ids}."""
    return {str(T): attention_probes(model, idx) for T, idx in sorted(idx_by_length.items())}


# --- the position-bias probe ------------------------------------------------------------------
# The position-bias probe: what b_h(i, j) each layer adds to its logits, read from the hooks the
# layer's encoding offers (``for_layer``: a layout or a plug-in may give every layer its own), never
# assuming a table over distances.
#
# - a *relative* bias (it overrides ``distance_bias``): the table b_h(n), n = 0..T-1 — the whole bias;
# - any other bias (FIRE's, which divides by the query's position; a bias of i and j apart): one
#   row per probed query position i, b_h(i, i - n) for n = 0..i, from ``position_bias`` asked for
#   that query alone (as the chunked path of long evaluation asks for a slice of queries). Rows
#   that differ between queries are what makes such a bias not a function of i - j.
#
# Layers that share one encoding module (a bias computed once per forward, as T5's) are one entry.

#: the query positions an absolute bias is read at, as fractions of the probed length
QUERY_FRACTIONS = (0.25, 0.5, 1.0)


def bias_layers(model: nn.Module) -> list[tuple[list[int], nn.Module]]:
    """(layers, encoding) for each distinct encoding with a position bias among the model's layers."""
    found: dict[int, tuple[list[int], nn.Module]] = {}
    for layer in range(len(model.blocks)):
        encoding = model.encoding.for_layer(layer)
        if encoding.offers("position_bias"):
            found.setdefault(id(encoding), ([], encoding))[0].append(layer)
    return list(found.values())


def query_positions(T: int) -> list[int]:
    """The query positions an absolute bias is read at: a quarter, half and all of T (the last)."""
    return sorted({max(0, round(f * T) - 1) for f in QUERY_FRACTIONS})


def row_at(encoding: nn.Module, i: int, device: torch.device | str) -> Tensor:
    """b_h(i, i - n) for n = 0..i: (H, i + 1), float32 on the CPU."""
    q = torch.tensor([i], device=device)
    k = torch.arange(i + 1, device=device)
    return encoding.position_bias(q, k)[:, 0, :].flip(-1).float().cpu()  # (H, 1, i+1) -> by distance


@torch.no_grad()
def position_bias_curve(encoding: nn.Module, T: int, device: torch.device | str = "cpu") -> dict:
    """One encoding's bias at length T: {"relative", "distance": 0..T-1, "bias": (H, T) — the
    table b_h(n) of a relative bias, else the last query's row b_h(T-1, T-1-n) — and for a bias
    that is not relative "by_query": {str(i): (H, i+1) rows b_h(i, i - n)}}."""
    encoding.prepare(T)
    n = torch.arange(T, device=device)
    if encoding.offers("distance_bias"):
        table = encoding.distance_bias(n).float().cpu()  # (H, T)
        return {"relative": True, "distance": n.tolist(), "bias": table.tolist()}
    rows = {i: row_at(encoding, i, device) for i in query_positions(T)}
    return {"relative": False, "distance": n.tolist(), "bias": rows[T - 1].tolist(),
            "by_query": {str(i): row.tolist() for i, row in rows.items()}}


@torch.no_grad()
def position_bias_curves(model: nn.Module, T: int, device: torch.device | str = "cpu") -> list[dict] | None:
    """Every distinct layer encoding's bias (``position_bias_curve``) with the layers that use it
    and its name; None for a model without a position bias in any layer."""
    found = bias_layers(model)
    if not found:
        return None
    return [{"layers": layers, "name": encoding.name, **position_bias_curve(encoding, T, device)}
            for layers, encoding in found]
