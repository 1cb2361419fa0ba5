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
                        title: str | None = None, rotary: bool = True) -> list[Path]:
    """PNGs of one length's probes (matplotlib Agg): entropy against query position per layer,
    mean distance per layer and head, rotary pair norms (unless rotary=False: written once for
    several lengths, write_probes), bias curves, each titled with ``title`` (the run and its
    encoding) and the length. The distance heatmap has its own colour scale, the length's range,
    and its numbers in the cells: a scale shared with 16× the length leaves the short one a single
    dark colour, and the numbers compare across lengths where colours cannot. Returns the paths
    written."""
    plt = pyplot()
    out, T = Path(out_dir), probes["length"]
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name: str, heading: str = "", legend: str | None = None) -> None:
        if title or heading:
            fig.suptitle("\n".join(filter(None, [f"{title} · T={T}" if title else "", heading])), fontsize=8)
        fig.tight_layout()
        legend_below(fig.axes, title=legend, fontsize=7)  # under the panels: it covers no curve
        paths.append(save_figure(fig, out / name))

    fig = _entropy_figure(plt, probes, train_length)
    save(fig, f"entropy_T{T}.png", legend="attention entropy at each query position, bucketed")

    distance = torch.tensor(probes["distance"], dtype=torch.float64)  # (layers, heads), tokens
    n_layer, n_head = distance.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.55 * n_head + 1.8), max(3.0, 0.45 * n_layer + 1.4)))
    im = ax.imshow(distance.numpy(), aspect="auto", cmap="viridis")  # this length's own range
    ax.set(xlabel="head", ylabel="layer", title=f"mean attention distance (T={T})")
    ax.set_xticks(range(n_head))  # whole heads and layers, not -0.5, 0.0, 0.5
    ax.set_yticks(range(n_layer))
    if n_layer * n_head <= 64:  # the numbers, readable across lengths; too many cells would be clutter
        middle = float(distance.min() + distance.max()) / 2
        for (layer, head), value in zip(torch.cartesian_prod(torch.arange(n_layer), torch.arange(n_head)).tolist(),
                                        distance.flatten().tolist()):
            ax.text(head, layer, f"{value:.0f}" if value >= 10 else f"{value:.1f}", ha="center", va="center",
                    fontsize=7, color="black" if value > middle else "white")
    fig.colorbar(im, ax=ax, label=f"Σ_j p_ij (i − j), tokens\n(T={T}'s own scale)")
    save(fig, f"distance_T{T}.png")

    if probes["rotary"] and rotary:
        paths.append(write_rotary_pairs(plt, {T: probes["rotary"]}, out, title))

    biases = probes["bias"] or []
    for b in biases:  # one figure per distinct layer encoding with a bias; bias.png where there is one
        fig, heading = _bias_figure(plt, b)
        save(fig, "bias.png" if len(biases) == 1 else f"bias_layer{b['layers'][0]}.png", heading, legend="head h")
    return paths


def write_rotary_pairs(plt, rotary_by_length: dict[int, dict], out: Path, title: str | None) -> Path:
    """rotary_pairs.png: the mean ‖q‖² and ‖k‖² of each rotary pair, a line per layer (Barbero et
    al., 2025: which frequencies a model uses), a row of panels per probed length on one y axis:
    one file for every length, where the differences between lengths read row against row."""
    fig, axes = plt.subplots(len(rotary_by_length), 2, figsize=(8, 2.4 * len(rotary_by_length) + 0.6), sharey=True,
                             sharex=True, squeeze=False)
    for row, (T, rot) in zip(axes, rotary_by_length.items()):
        for ax, key in zip(row, ("q_sq_norm", "k_sq_norm")):
            for layer, values in enumerate(rot[key]):
                ax.plot(values, marker=".", lw=1, label=f"{layer}")
            if rot["rotated_pairs"] < len(rot["theta"]):  # partial rotary: the unrotated pairs on the right
                ax.axvline(rot["rotated_pairs"] - 0.5, color="grey", ls="--", lw=0.8)
            ax.set_title(f"mean ‖{key[0]}‖² per pair, T={T}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("pair i (θ_i falls with i)")
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    legend_below(list(axes[-1]), title="layer", fontsize=7)
    return save_figure(fig, out / "rotary_pairs.png")


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
    for T, probes in probes_by_length.items():
        paths += write_probe_figures(probes, out / f"T{T}" if several else out, train_length, title, rotary=not several)
    if several and next(iter(probes_by_length.values()))["rotary"]:  # one figure for every length, not one each
        paths.append(write_rotary_pairs(plt, {int(T): p["rotary"] for T, p in probes_by_length.items()}, out, title))
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
        legend_below([ax], title="layer", fontsize=7)
        paths.append(save_figure(fig, out / "entropy_vs_length.png"))
    return paths
