"""PNG figures of length: RoPE's long-term decay (RoFormer §3.4.3) and perplexity against length.

matplotlib with the Agg backend (no display needed). Run directories are read through
their summary.json only, so runs made on another machine plot the same.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from posenc.errors import UserError  # noqa: E402


def rope_decay_bound(distances: np.ndarray, head_dim: int, base: float) -> np.ndarray:
    """RoFormer §3.4.3: the relative upper bound (1/(d/2)) Σ_{j=1}^{d/2} |S_j| of the score,
    S_j = Σ_{k=0}^{j-1} e^{i(m-n)θ_k}, θ_k = base^(-2k/d), at each distance m - n."""
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)  # (d/2,)
    phases = np.exp(1j * np.outer(distances, theta))  # (R, d/2)
    partial_sums = np.cumsum(phases, axis=1)  # S_1 .. S_{d/2}
    return np.abs(partial_sums).mean(axis=1)


def plot_decay(bases: list[float], head_dim: int, max_distance: int, out: Path) -> Path:
    distances = np.arange(0, max_distance + 1)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for base in bases:
        ax.plot(distances, rope_decay_bound(distances, head_dim, base), label=f"base = {base:g}")
    ax.set_xlabel("relative distance m − n (tokens)")
    ax.set_ylabel("relative upper bound  (1/(d/2)) Σ_j |S_j|")
    ax.set_title(f"RoPE long-term decay (RoFormer §3.4.3), head dim d = {head_dim}")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out)


def find_summaries(paths: list[Path]) -> list[tuple[Path, dict]]:
    """(run dir, summary) for every summary.json at or below each path, with extrapolation."""
    found = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UserError(f"{path} does not exist — pass run directories or sweep directories")
        files = [path / "summary.json"] if (path / "summary.json").exists() else sorted(path.rglob("summary.json"))
        for f in files:
            summary = json.loads(f.read_text())
            if summary.get("extrapolation"):
                found.append((f.parent, summary))
    if not found:
        raise UserError("no run with an extrapolation evaluation found under "
                        f"{', '.join(map(str, paths))} — train with eval.at_end=true or run `posenc eval`")
    return found


def run_labels(summaries: list[dict]) -> list[str]:
    """The encoding name, plus the options that tell apart runs of the same encoding."""
    by_name: dict[str, list[dict]] = defaultdict(list)
    for s in summaries:
        by_name[s["encoding"]["name"]].append(s["encoding"])
    labels = []
    for s in summaries:
        enc = s["encoding"]
        group = by_name[enc["name"]]
        differ = [k for k in enc if k != "name" and len({json.dumps(g.get(k)) for g in group}) > 1]
        labels.append(enc["name"] + (" (" + ", ".join(f"{k}={enc[k]}" for k in differ) + ")" if differ else ""))
    return labels


def extrapolation_curves(found: list[tuple[Path, dict]]) -> dict[str, dict[int, float]]:
    """label -> {eval length: ppl (mean over runs with the same label)}; undefined lengths left out."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for label, (_, s) in zip(run_labels([s for _, s in found]), found):
        for r in s["extrapolation"]["lengths"]:
            if r["ppl"] is not None and math.isfinite(r["ppl"]):
                acc[label][r["length"]].append(r["ppl"])
    return {label: {n: float(np.mean(v)) for n, v in sorted(points.items())} for label, points in acc.items()}


def plot_extrapolation(paths: list[Path], out: Path) -> Path:
    found = find_summaries(paths)
    curves = extrapolation_curves(found)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, points in sorted(curves.items()):
        ax.plot(list(points), list(points.values()), marker="o", label=label)
    for i, seq_len in enumerate(sorted({s["seq_len"] for _, s in found})):
        ax.axvline(seq_len, color="grey", linestyle="--", linewidth=1, label="training length" if i == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lengths = sorted({n for points in curves.values() for n in points})
    seq_lens = {s["seq_len"] for _, s in found}
    ax.set_xticks(lengths)  # the evaluated lengths themselves, with the multiple when unambiguous
    ax.set_xticklabels([f"{n}\n({n / next(iter(seq_lens)):g}×)" if len(seq_lens) == 1 else str(n) for n in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("evaluation length (tokens, log scale; × training length)")
    ax.set_ylabel("validation perplexity (log scale)")
    ax.set_title("Length extrapolation: perplexity beyond the training length")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9)
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return out
