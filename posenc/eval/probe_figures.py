"""The probes' figures: what posenc/eval/probes.py measures, drawn (matplotlib Agg) and written
with probes.json: entropy against query position per layer (log-spaced buckets), mean distance
per layer and head, rotary pair norms, bias curves, and entropy against the probed lengths."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from posenc.display.figures import legend_below, log2_positions, pyplot, save_figure
from posenc.record.rundir import PROBES_FILE


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


def _head_lines(plt, fig, ax, rows: list[list[float]], x: list[int]) -> None:
    """One line per head: a legend names up to 8 heads; more are coloured by head index on a
    colour bar (a legend of 16 heads would be longer than the plot)."""
    n_head = len(rows)
    many = n_head > 8
    colours = plt.get_cmap("viridis")([h / max(1, n_head - 1) for h in range(n_head)]) if many else [None] * n_head
    for h, (row, colour) in enumerate(zip(rows, colours)):
        ax.plot(x[: len(row)], row, lw=1, color=colour, label=None if many else f"head {h}")
    if many:
        bar = fig.colorbar(plt.cm.ScalarMappable(plt.Normalize(0, n_head - 1), "viridis"), ax=ax)
        bar.set_label("head h")


def _bias_figure(plt, b: dict) -> tuple[object, str]:
    """A relative bias: b_h(n) against distance, a line per head. Any other bias: a panel per
    probed query position i, b_h(i, i - n) against n, on one y axis, so a bias that changes with
    the query (FIRE's, an absolute one) shows as panels that differ. Returns (figure, heading)."""
    where = f"layers {', '.join(map(str, b['layers']))}" if "layers" in b else ""
    if b.get("relative", True):
        fig, ax = plt.subplots(figsize=(4.5, 3))
        _head_lines(plt, fig, ax, b["bias"], b["distance"])
        ax.set(xlabel="distance n = i - j", ylabel="b_h(n)", title=" ".join(filter(None, ["position bias", b.get("name"), where])))
        return fig, ""
    queries = b["by_query"]
    fig, axes = plt.subplots(1, len(queries), figsize=(3.2 * len(queries), 3), sharey=True, squeeze=False)
    for ax, (i, rows) in zip(axes[0], queries.items()):
        _head_lines(plt, fig, ax, rows, b["distance"])
        ax.set(xlabel="distance n = i - j", title=f"query i = {i}")
    axes[0][0].set_ylabel("b_h(i, i − n)")
    return fig, " ".join(filter(None, ["position bias", b.get("name"), where])) + ": not a function of i − j alone"


def write_probe_figures(probes: dict, out_dir: str | Path, train_length: int | None = None,
                        title: str | None = None, distance_range: tuple[float, float] | None = None) -> list[Path]:
    """PNGs of one length's probes (matplotlib Agg): entropy against query position per layer,
    mean distance per layer and head, rotary pair norms, bias curves, each titled with ``title``
    (the run and its encoding) and the length. ``distance_range``: the distance heatmap's colour
    scale, shared by every length probed so one colour is one distance in each of them. Returns
    the paths written."""
    plt = pyplot()
    out, T = Path(out_dir), probes["length"]
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name: str, heading: str = "") -> None:
        if title or heading:
            fig.suptitle("\n".join(filter(None, [f"{title} · T={T}" if title else "", heading])), fontsize=8)
        fig.tight_layout()
        legend_below(fig.axes, fontsize=7)  # under the panels: it covers no curve
        paths.append(save_figure(fig, out / name))

    fig = _entropy_figure(plt, probes, train_length)
    save(fig, f"entropy_T{T}.png")

    fig, ax = plt.subplots(figsize=(4, 3))
    low, high = distance_range or (None, None)
    im = ax.imshow(probes["distance"], aspect="auto", cmap="viridis", vmin=low, vmax=high)
    ax.set(xlabel="head", ylabel="layer", title=f"mean attention distance (T={T})")
    n_layer, n_head = torch.tensor(probes["distance"]).shape
    ax.set_xticks(range(n_head))  # whole heads and layers, not -0.5, 0.0, 0.5
    ax.set_yticks(range(n_layer))
    fig.colorbar(im, ax=ax, label="Σ_j p_ij (i − j), tokens" + ("\n(one scale for every T)" if distance_range else ""))
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

    biases = probes["bias"] or []
    for b in biases:  # one figure per distinct layer encoding with a bias; bias.png where there is one
        fig, heading = _bias_figure(plt, b)
        save(fig, "bias.png" if len(biases) == 1 else f"bias_layer{b['layers'][0]}.png", heading)
    return paths


def write_probes(probes_by_length: dict[str, dict], out_dir: str | Path, train_length: int | None = None,
                 title: str | None = None, about: dict | None = None) -> list[Path]:
    """probes.json plus each length's figures (in T<length>/ when there are several lengths)
    and entropy_vs_length.png: each layer's mean entropy over heads and queries against T, on a
    log axis ticked at the probed lengths. ``title`` (the run and its encoding) heads every figure;
    ``about``: entries probes.json holds beside the lengths (whether the checkpoint rebuilt its model)."""
    import json

    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{PROBES_FILE}.tmp"
    tmp.write_text(json.dumps({**probes_by_length, **(about or {})}))
    tmp.replace(out / PROBES_FILE)  # never a half-written file
    paths = [out / PROBES_FILE]
    several = len(probes_by_length) > 1
    distances = torch.cat([torch.tensor(p["distance"], dtype=torch.float64).flatten() for p in probes_by_length.values()])
    shared = (float(distances.min()), float(distances.max())) if several else None  # issue 47: one colour scale
    for T, probes in probes_by_length.items():
        paths += write_probe_figures(probes, out / f"T{T}" if several else out, train_length, title, shared)
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
