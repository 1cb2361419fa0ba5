"""PNG figures of length: RoPE's long-term decay (RoFormer §3.4.3) and perplexity against length.

The extrapolation figure takes the groups of `posenc compare` (runs.py): one line per group in
its fixed style (report/style.py), the mean over its completed seeds, its 95% interval shaded. Runs are read from their directories
only (summary.json, .hydra/), so runs made on another machine plot the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from posenc.display.figures import legend_below
from posenc.errors import UserError
from posenc.record.metrics import EXTRAPOLATION_PPL, TASK_ACCURACY
from posenc.report.plots import (  # selects the Agg backend first
    interval_note,
    legend_heading,
    line_width,
    save_figure,
    seeds_note,
    titled,
)
from posenc.report.runs import (
    Group,
    deduplicate,
    find_runs,
    format_value,
    group_runs,
    varying_keys,
)
from posenc.report.setup import setup_line
from posenc.report.spread import Spread, hold_spread, seed_spread
from posenc.report.stats import Stat, aggregate, scale_of
from posenc.report.style import group_families, styles_for


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
    ax.set_title(f"RoPE long-term decay (RoFormer §3.4.3), head dim d = {head_dim}", fontsize=10)
    ax.grid(alpha=0.3)
    legend_below([ax], title="RoPE base")
    return save_figure(fig, out)


def evaluated_lengths(group: Group) -> list[int]:
    """The evaluation lengths (tokens) in the summaries of the group's completed runs."""
    return sorted({int(m["length"]) for r in group.completed for k in r.summary if (m := EXTRAPOLATION_PPL.match(k))})


def length_stats(group: Group) -> dict[int, Stat]:
    """length -> perplexity over the completed seeds evaluated there: the geometric mean and 95%
    interval the tables print (report/stats.py). A length where any seed has no perplexity (null:
    not defined, e.g. learned beyond max_len) has no mean."""
    stats = {}
    for n in evaluated_lengths(group):
        key = EXTRAPOLATION_PPL.key(length=n)
        stats[n] = aggregate([r.metric(key) for r in group.completed if key in r.summary], scale_of(key))
    return stats


def extrapolation_groups(paths: Sequence[Path]) -> list[Group]:
    """The runs under paths grouped as `posenc compare` groups them (by what the sweep varied;
    a lone run or a sweep of seeds is labelled by its encoding), one run per (config, seed) as
    compare keeps them: a run given twice (on its own and inside a sweep) counts once."""
    runs, _ = deduplicate(find_runs(paths))
    if not any(r.ok and EXTRAPOLATION_PPL.match(k) for r in runs for k in r.summary or {}):
        raise UserError(f"no finished run with an extrapolation evaluation under {', '.join(map(str, paths))} "
                        "— train with eval.at_end=true and eval.lengths=[1,2,4,...]")
    return group_runs(runs, varying_keys(runs) or ["encoding"])


def plot_extrapolation(groups: Sequence[Group], out: Path, title: str = "", setup: str | None = None) -> Path:
    """Perplexity against evaluation length: log-x (base 2) with the lengths and their multiples
    of the training length as ticks, log-y, the training length dashed. Lengths without a
    perplexity are left out of the line and named in its legend entry."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    styles = styles_for([g.label for g in groups], group_families(groups))
    plotted: list[int] = []
    y_range: list[float] = []
    banded = False
    points_drawn: list[tuple[int, float]] = []  # (length, mean) of every point, for the seed spread's floor
    counts: list[int] = []
    for group in groups:
        stats = length_stats(group)
        if not stats:
            continue  # no completed run of this group was evaluated at other lengths
        counts.append(len(group.completed))
        points = [(n, s) for n, s in stats.items() if s.mean is not None]
        label = f"{group.label} (n={len(group.completed)})"
        undefined = [n for n, s in stats.items() if s.mean is None]
        if undefined:
            label += f"; not defined at {', '.join(map(str, undefined))}"
        x = np.array([n for n, _ in points])
        mean = np.array([s.mean for _, s in points])
        style = styles[group.label]
        ax.plot(x, mean, markersize=6, linewidth=line_width(len(counts) - 1), label=label, **style.line())
        y_range += list(mean)
        points_drawn += [(int(n), float(m)) for n, m in zip(x, mean)]
        if len(group.completed) > 1 and len(x):  # the interval of the tables: positive, so a log axis draws it whole
            banded = True
            ax.fill_between(x, [s.mean if s.low is None else s.low for _, s in points],
                            [s.mean if s.high is None else s.high for _, s in points],
                            color=style.color, alpha=0.2, linewidth=0)
        plotted += stats
    seq_lens = sorted({int(r.config["trainer.seq_len"]) for g in groups for r in g.completed
                       if "trainer.seq_len" in r.config and evaluated_lengths(g)})
    for i, seq_len in enumerate(seq_lens):
        ax.axvline(seq_len, color="grey", linestyle="--", linewidth=1, label="training length" if i == 0 else None)
    lengths = sorted(set(plotted))
    ax.set_xscale("log", base=2)
    # log-y only when perplexities span a wide range; a narrow one reads better on a linear axis
    log_y = bool(y_range) and max(y_range) / min(y_range) > 4
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(lengths)  # the evaluated lengths themselves, with the multiple when unambiguous
    ax.set_xticklabels([f"{n}\n({format_value(n / seq_lens[0])}×)" if len(seq_lens) == 1 else str(n) for n in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("evaluation length (tokens, log scale; × training length)")
    ax.set_ylabel("validation perplexity" + (" (log scale)" if log_y else ""))
    spread, where = hold_length_spread(ax, groups, points_drawn, seq_lens) if any(n == 1 for n in counts) else (None, "")
    if setup is None:
        setup = setup_line([r for g in groups for r in g.runs])
    titled(ax, title or "Length extrapolation: perplexity beyond the training length", setup,
           seeds_note(counts, spread, where))
    ax.grid(alpha=0.3, which="both")
    legend_below([ax], legend_heading(groups, interval_note(EXTRAPOLATION_PPL.key(length=seq_lens[0] if seq_lens else 1),
                                                            banded)))
    return save_figure(fig, out)


def hold_length_spread(ax, groups: Sequence[Group], points: list[tuple[int, float]],
                       seq_lens: list[int]) -> tuple[Spread | None, str]:
    """One seed: the axis holds each (length, perplexity) point ± the seed spread at its length.
    Returns the spread at the shortest length and where it was taken, for the title."""
    spreads = {n: length_spread(groups, n, seq_lens) for n in {n for n, _ in points}}
    kept = [(m, spreads[n]) for n, m in points if spreads[n] is not None]
    if not kept:
        return None, ""
    hold_spread(ax, [m for m, _ in kept], [sp for _, sp in kept])
    shortest = min(n for n, sp in spreads.items() if sp is not None)
    return spreads[shortest], f" at {shortest} tokens, per length"


def length_spread(groups: Sequence[Group], length: int, seq_lens: list[int]) -> Spread | None:
    """The seed spread of the perplexity at one evaluation length: the groups' own seeds there where
    some group has two, else the measured spread at its multiple of the (one) training length."""
    key = EXTRAPOLATION_PPL.key(length=length)
    per_group = [[r.metric(key) for r in g.completed if key in r.summary] for g in groups]
    return seed_spread(key, per_group, length / seq_lens[0] if len(seq_lens) == 1 else None)


def task_names(groups: Sequence[Group]) -> list[str]:
    """The synthetic tasks whose accuracy by length the groups' completed runs hold."""
    return sorted({m["task"] for g in groups for r in g.completed for k in r.summary if (m := TASK_ACCURACY.match(k))})


def accuracy_stats(group: Group, task: str) -> dict[int, Stat]:
    """length -> exact-match accuracy mean and 95% interval over the completed seeds; no mean
    where a seed has none (null: not applicable, e.g. learned positions beyond max_len)."""
    keys = {int(m["length"]): k for r in group.completed for k in r.summary
            if (m := TASK_ACCURACY.match(k)) and m["task"] == task}
    return {n: aggregate([r.metric(k) for r in group.completed if k in r.summary], scale_of(k))
            for n, k in sorted(keys.items())}


def plot_task_accuracy(groups: Sequence[Group], task: str, out: Path, title: str = "", setup: str | None = None) -> Path:
    """Exact-match accuracy against evaluation length (Kazemnejad et al. 2023, Fig. 1 style):
    log-x (base 2) at the evaluated lengths, accuracy 0-100%, the training length dashed, the
    95% interval over seeds shaded (clipped to [0, 100%])."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    styles = styles_for([g.label for g in groups], group_families(groups))
    lengths: set[int] = set()
    banded = False
    counts: list[int] = []
    for group in groups:
        stats = accuracy_stats(group, task)
        points = [(n, s) for n, s in stats.items() if s.mean is not None]
        if not points:
            continue
        counts.append(len(group.completed))
        label = f"{group.label} (n={len(group.completed)})"
        undefined = [n for n, s in stats.items() if s.mean is None]
        if undefined:
            label += f"; n/a at {', '.join(map(str, undefined))}"
        x = np.array([n for n, _ in points])
        mean = 100 * np.array([s.mean for _, s in points])
        style = styles[group.label]
        ax.plot(x, mean, markersize=6, linewidth=line_width(len(counts) - 1), label=label, **style.line())
        if len(group.completed) > 1:  # the tables' interval, inside [0, 100%]
            banded = True
            ax.fill_between(x, [100 * (s.mean if s.low is None else s.low) for _, s in points],
                            [100 * (s.mean if s.high is None else s.high) for _, s in points],
                            color=style.color, alpha=0.2, linewidth=0)
        lengths.update(stats)
    seq_lens = sorted({int(r.config["trainer.seq_len"]) for g in groups for r in g.completed
                       if "trainer.seq_len" in r.config})
    for i, seq_len in enumerate(seq_lens):
        ax.axvline(seq_len, color="grey", linestyle="--", linewidth=1, label="training length" if i == 0 else None)
    ax.set_xscale("log", base=2)
    ticks = sorted(lengths)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{n}\n({format_value(n / seq_lens[0])}×)" if len(seq_lens) == 1 else str(n) for n in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylim(-3, 103)
    ax.set_xlabel("evaluation length (tokens, log scale; × training length)")
    ax.set_ylabel(f"{task}: exact-match accuracy (%)")
    if setup is None:
        setup = setup_line([r for g in groups for r in g.runs])
    titled(ax, title or f"{task}: accuracy beyond the training length", setup, seeds_note(counts))
    ax.grid(alpha=0.3, which="both")
    legend_below([ax], legend_heading(groups, interval_note(TASK_ACCURACY.key(task=task, length=1), banded)))
    return save_figure(fig, out)
