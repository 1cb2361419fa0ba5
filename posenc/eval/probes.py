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
- for position biases, b_h(n) against the distance n per head (``distance_bias`` where the
  encoding offers it, else the last query's row of ``position_bias``).

Everything returned is plain lists and numbers (JSON-ready); ``write_probe_figures`` draws PNGs.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn

from posenc.figures import legend_below, log2_positions, pyplot, save_figure


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
def position_bias_curve(encoding: nn.Module, max_distance: int, device: torch.device | str = "cpu") -> dict | None:
    """b_h(n) for n = 0..max_distance-1 per head, or None for an encoding without a bias."""
    if not encoding.has_position_bias:
        return None
    n = torch.arange(max_distance, device=device)
    table = encoding.distance_bias(n)  # (H, R) or None
    if table is None:  # a bias not of the distance alone: the row of the last query, read backwards
        table = encoding.position_bias(n, n)[:, -1, :].flip(-1)
    return {"distance": n.tolist(), "bias": table.float().cpu().tolist()}


@torch.no_grad()
def attention_probes(model: nn.Module, idx: Tensor) -> dict:
    """All probes at one length T = idx.shape[1]: JSON-ready.

    entropy[layer][head][i] and distance_by_query[layer][head][i]: averaged over the batch;
    distance[layer][head]: averaged over queries too; max_entropy[i] = log(i+1), a uniform
    row's; rotary and bias: see ``rotary_frequency_norms`` and ``position_bias_curve``."""
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
        "bias": position_bias_curve(model.encoding, T, idx.device),
    }


def log_buckets(T: int, buckets: int = 64) -> Tensor:
    """Edges 0 = e_0 < e_1 < ... = T of at most ``buckets`` query-position buckets equal in width
    on a log axis: single positions near the start (where entropy changes fastest), wider ones
    further out, each averaging away the position-to-position noise of a few probe windows."""
    edges = torch.logspace(0, math.log10(T), buckets).round().long()
    return torch.unique(torch.cat((torch.tensor([0]), edges, torch.tensor([T]))))


def _entropy_figure(plt, probes: dict, train_length: int | None):
    """Attention entropy against query position, a panel per layer, on the log-2 position axis
    of the per-position loss: the mean over heads as a line, the range over heads (min to max)
    shaded, a uniform row's log(i+1) dotted; positions averaged in log-spaced buckets. One line
    per head at every position tangles into noise at 512+ positions; the mean and range read at
    any length and still show a head gone sharp (the band's lower edge) or uniform (its upper)."""
    n_layer = len(probes["entropy"])
    T = len(probes["max_entropy"])
    edges = log_buckets(T)
    centres = (edges[:-1] + edges[1:] - 1) / 2  # mean position of each bucket
    width = (edges[1:] - edges[:-1]).double()

    def bucketed(rows: Tensor) -> Tensor:  # (..., T) -> (..., buckets): the mean inside each bucket
        sums = torch.cumsum(torch.nn.functional.pad(rows.double(), (1, 0)), -1)
        return (sums[..., edges[1:]] - sums[..., edges[:-1]]) / width

    fig, axes = plt.subplots(1, n_layer, figsize=(3.2 * n_layer, 3), sharey=True, squeeze=False)
    for layer, ax in enumerate(axes[0]):
        heads = bucketed(torch.tensor(probes["entropy"][layer]))  # (H, buckets)
        ax.fill_between(centres, heads.min(0).values, heads.max(0).values, color="C0", alpha=0.25, linewidth=0,
                        label=f"range over the {len(heads)} heads")
        ax.plot(centres, heads.mean(0), color="C0", lw=1.4, label="mean over heads")
        ax.plot(centres, bucketed(torch.tensor(probes["max_entropy"])), "k:", lw=1, label="uniform row, log(i+1)")
        if train_length and train_length < T:
            ax.axvline(train_length, color="grey", ls="--", lw=0.8, label=f"training length {train_length}")
        log2_positions(ax, T, train_length if train_length and train_length < T else None)
        ax.set(title=f"layer {layer}", xlabel="query position i (log scale)")
    axes[0][0].set_ylabel("attention entropy (nats)")
    return fig


def _bias_figure(plt, b: dict):
    """b_h(n) against distance, a line per head: a legend names up to 8 heads; more are coloured
    by head index on a colour bar (a legend of 16 heads would be longer than the plot)."""
    fig, ax = plt.subplots(figsize=(4.5, 3))
    n_head = len(b["bias"])
    many = n_head > 8
    colours = plt.get_cmap("viridis")([h / max(1, n_head - 1) for h in range(n_head)]) if many else [None] * n_head
    for h, (row, colour) in enumerate(zip(b["bias"], colours)):
        ax.plot(b["distance"], row, lw=1, color=colour, label=None if many else f"head {h}")
    if many:
        bar = fig.colorbar(plt.cm.ScalarMappable(plt.Normalize(0, n_head - 1), "viridis"), ax=ax)
        bar.set_label("head h")
    ax.set(xlabel="distance n = i - j", ylabel="b_h(n)", title="position bias")
    return fig


def write_probe_figures(probes: dict, out_dir: str | Path, train_length: int | None = None,
                        title: str | None = None) -> list[Path]:
    """PNGs of one length's probes (matplotlib Agg): entropy against query position per layer,
    mean distance per layer and head, rotary pair norms, bias curves, each titled with ``title``
    (the run and its encoding) and the length. Returns the paths written."""
    plt = pyplot()
    out, T = Path(out_dir), probes["length"]
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name: str) -> None:
        if title:
            fig.suptitle(f"{title} · T={T}", fontsize=8)
        fig.tight_layout()
        legend_below(fig.axes, fontsize=7)  # under the panels: it covers no curve
        paths.append(save_figure(fig, out / name))

    fig = _entropy_figure(plt, probes, train_length)
    save(fig, f"entropy_T{T}.png")

    fig, ax = plt.subplots(figsize=(4, 3))
    im = ax.imshow(probes["distance"], aspect="auto", cmap="viridis")
    ax.set(xlabel="head", ylabel="layer", title=f"mean attention distance (T={T})")
    fig.colorbar(im, ax=ax, label="Σ_j p_ij (i − j), tokens")
    save(fig, f"distance_T{T}.png")

    if probes["rotary"]:
        rot = probes["rotary"]
        fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
        for ax, key in zip(axes, ("q_sq_norm", "k_sq_norm")):
            for layer, row in enumerate(rot[key]):
                ax.plot(row, marker=".", lw=1, label=f"layer {layer}")
            if rot["rotated_pairs"] < len(rot["theta"]):  # partial rotary: the unrotated pairs on the right
                ax.axvline(rot["rotated_pairs"] - 0.5, color="grey", ls="--", lw=0.8)
            ax.set(xlabel="pair i (θ_i falls with i)", title=f"mean ‖{key[0]}‖² per pair")
        save(fig, "rotary_pairs.png")

    if probes["bias"]:
        save(_bias_figure(plt, probes["bias"]), "bias.png")
    return paths


def probe_lengths(model: nn.Module, idx_by_length: dict[int, Tensor]) -> dict[str, dict]:
    """``attention_probes`` at several lengths (e.g. 1×, 2×, 4× the training length), keyed by
    str(length) so the result is JSON as is. idx_by_length: {T: (B, T) token ids}."""
    return {str(T): attention_probes(model, idx) for T, idx in sorted(idx_by_length.items())}


def write_probes(probes_by_length: dict[str, dict], out_dir: str | Path, train_length: int | None = None,
                 title: str | None = None) -> list[Path]:
    """probes.json plus each length's figures (in T<length>/ when there are several lengths)
    and entropy_vs_length.png: each layer's mean entropy over heads and queries against T, on a
    log axis ticked at the probed lengths. ``title`` (the run and its encoding) heads every figure."""
    import json

    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "probes.json.tmp"
    tmp.write_text(json.dumps(probes_by_length))
    tmp.replace(out / "probes.json")  # never a half-written file
    paths = [out / "probes.json"]
    several = len(probes_by_length) > 1
    for T, probes in probes_by_length.items():
        paths += write_probe_figures(probes, out / f"T{T}" if several else out, train_length, title)
    if several:
        lengths = [int(T) for T in probes_by_length]
        fig, ax = plt.subplots(figsize=(4.5, 3))
        n_layer = len(next(iter(probes_by_length.values()))["entropy"])
        for layer in range(n_layer):
            means = [float(torch.tensor(p["entropy"][layer]).mean()) for p in probes_by_length.values()]
            ax.plot(lengths, means, marker="o", label=f"layer {layer}")
        if train_length:
            ax.axvline(train_length, color="grey", ls="--", lw=0.8, label=f"training length {train_length}")
        ax.set(xscale="log", xlabel="context length T", ylabel="mean attention entropy (nats)")
        ax.set_xticks(lengths, [str(L) for L in lengths])  # 64, 128, 256: not 3×10², 4×10²
        ax.minorticks_off()
        if title:
            ax.set_title(title, fontsize=8)
        fig.tight_layout()
        legend_below([ax], fontsize=7)
        paths.append(save_figure(fig, out / "entropy_vs_length.png"))
    return paths
