"""The tables of docs/transfer.md and docs/model_recipe.md (issue 26) from sweep directories.

    python scripts/transfer_tables.py recipe SWEEP...   # experiment=recipe_ablation: ppl growth 64 -> 1024 per recipe
    python scripts/transfer_tables.py ladder SWEEP...   # experiment=scale_ladder: rankings per size and budget, Kendall τ, flips
    python scripts/transfer_tables.py budget SWEEP...   # experiment=tasks_budget: flip-flop exact match per budget

An interim script: `posenc compare SWEEP --by encoding --within model` (rank intervals, Kendall τ
with a bootstrap interval, flips) should replace the ladder part once it is on main. Statistics
are scipy.stats': perplexity intervals are t-intervals of the loss (log perplexity) over seeds,
mapped back with exp (never negative); a difference is "detectable" where Welch's 95% interval
of the log difference excludes 0; Kendall's τ (scipy.stats.kendalltau) between two rankings of the
group means, with a 95% bootstrap interval (each group's seeds drawn with replacement, 2000 times).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from posenc.report.runs import Run, find_runs

RECIPES = ["llama", "llama_tied_head", "llama_gpt2_init", "llama_gelu", "llama_layernorm", "llama_bias", "gpt2"]
RESAMPLES = 2000


# --- statistics (scipy) -------------------------------------------------------------------
def log_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(geometric mean, low, high): the 95% t-interval of log(values) over seeds, mapped back."""
    x = np.log(np.asarray(values, dtype=float))
    if len(x) < 2:
        return float(np.exp(x.mean())), math.nan, math.nan
    low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    return float(np.exp(x.mean())), float(np.exp(low)), float(np.exp(high))


def welch_log_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(ratio of geometric means a/b, low, high): Welch's 95% interval of mean(log a) - mean(log b)."""
    la, lb = np.log(a), np.log(b)
    ci = stats.ttest_ind(la, lb, equal_var=False).confidence_interval(0.95)
    return float(np.exp(la.mean() - lb.mean())), float(np.exp(ci.low)), float(np.exp(ci.high))


def detectable(a: Sequence[float], b: Sequence[float]) -> bool:
    _, low, high = welch_log_ratio(a, b)
    return not (low <= 1 <= high)


def kendall(u: dict[str, list[float]], v: dict[str, list[float]], seed: int = 0) -> tuple[float, float, float]:
    """Kendall's τ between the rankings of the groups' geometric means at u and at v, with its 95%
    bootstrap interval over seeds."""
    groups = sorted(set(u) & set(v))
    point = stats.kendalltau([gm(u[g]) for g in groups], [gm(v[g]) for g in groups]).statistic
    rng = np.random.default_rng(seed)

    def resample(side: dict[str, list[float]]) -> np.ndarray:  # (RESAMPLES, groups) of mean log values
        return np.stack([np.log(side[g])[rng.integers(0, len(side[g]), (RESAMPLES, len(side[g])))].mean(1)
                         for g in groups], axis=1)

    bu, bv = resample(u), resample(v)
    taus = np.array([stats.kendalltau(bu[i], bv[i]).statistic for i in range(RESAMPLES)])
    low, high = np.nanpercentile(taus, [2.5, 97.5])
    return float(point), float(low), float(high)


def flips(u: dict[str, list[float]], v: dict[str, list[float]]) -> list[str]:
    """Pairs ordered one way at u and the other at v (lower is better); 'confident' where both
    orders are detectable, else 'within noise'."""
    out = []
    for a, b in itertools.combinations(sorted(set(u) & set(v)), 2):
        if (gm(u[a]) < gm(u[b])) != (gm(v[a]) < gm(v[b])):
            sure = detectable(u[a], u[b]) and detectable(v[a], v[b])
            first, second = (a, b) if gm(u[a]) < gm(u[b]) else (b, a)
            out.append(f"{first}<{second} → {second}<{first} ({'confident' if sure else 'within noise'})")
    return out


def gm(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def fmt(values: Sequence[float], digits: int = 2) -> str:
    mean, low, high = log_interval(values)
    return f"{mean:.{digits}f}" if math.isnan(low) else f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


# --- runs ---------------------------------------------------------------------------------
def completed(paths: Sequence[Path]) -> list[Run]:
    runs = find_runs(paths)
    bad = [r for r in runs if not r.ok]
    for r in bad:
        print(f"<!-- left out: {r.path} ({r.status}) -->")
    return [r for r in runs if r.ok]


def by(runs: Sequence[Run], *keys: str) -> dict[tuple, list[Run]]:
    out: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        out[tuple(str(r.value(k)) for k in keys)].append(r)
    return out


def wall(runs: Sequence[Run]) -> str:
    seconds = [r.metric("wall_time_s") or 0.0 for r in runs]
    return (f"{len(runs)} runs, {sum(seconds) / 60:.1f} min of run wall time in all "
            f"({min(seconds):.0f}–{max(seconds):.0f} s a run)")


# --- the three tables ---------------------------------------------------------------------
def recipe_table(runs: Sequence[Run], short: int, long: int) -> str:
    lines = []
    groups = by(runs, "encoding", "recipe")
    for encoding in sorted({k[0] for k in groups}):
        base = [r.metric(f"extrapolation/ppl@{long}") / r.metric(f"extrapolation/ppl@{short}")
                for r in groups.get((encoding, "llama"), [])]
        lines += [f"\n**{encoding}** (growth = ppl@{long} / ppl@{short}; vs llama: ratio of growths, Welch 95%)\n",
                  f"| recipe | seeds | ppl@{short} | ppl@{long} | growth ×{long // short} length | per seed | vs llama |",
                  "|---|---|---|---|---|---|---|"]
        for recipe in RECIPES:
            rs = sorted(groups.get((encoding, recipe), []), key=lambda r: r.seed)
            if not rs:
                continue
            p_short = [r.metric(f"extrapolation/ppl@{short}") for r in rs]
            p_long = [r.metric(f"extrapolation/ppl@{long}") for r in rs]
            growth = [b / a for a, b in zip(p_short, p_long)]
            versus = "—"
            if recipe != "llama" and len(base) > 1 and len(growth) > 1:
                ratio, low, high = welch_log_ratio(growth, base)
                verdict = "detectable" if not (low <= 1 <= high) else "no detectable difference"
                versus = f"{ratio:.2f} [{low:.2f}, {high:.2f}] {verdict}"
            lines.append(f"| {recipe} | {','.join(str(r.seed) for r in rs)} | {fmt(p_short)} | {fmt(p_long)} | "
                         f"×{fmt(growth)} | {', '.join(f'{g:.2f}' for g in growth)} | {versus} |")
    return "\n".join(lines + ["", wall(runs)])


def ladder_tables(runs: Sequence[Run], lengths: Sequence[int], sizes: Sequence[str]) -> str:
    groups = by(runs, "budget", "model", "encoding")
    budgets = sorted({k[0] for k in groups})
    sizes = [s for s in sizes if any(k[1] == s for k in groups)]
    values = lambda b, s, L: {k[2]: [r.metric(f"extrapolation/ppl@{L}") for r in rs]  # noqa: E731
                              for k, rs in groups.items() if k[:2] == (b, s)}
    lines = []
    for L in lengths:
        lines += [f"\n**ppl@{L}**: encodings ranked within each size (geometric mean [95% t-interval of the loss] over seeds)\n",
                  "| budget | size | params | 1st | 2nd | 3rd | 4th | 5th |", "|---|---|---|---|---|---|---|---|"]
        for b, s in itertools.product(budgets, sizes):
            v = values(b, s, L)
            order = sorted(v, key=lambda e: gm(v[e]))
            params = next(iter(groups[(b, s, order[0])])).metric("params")
            cells = []
            for i, e in enumerate(order):
                tie = i + 1 < len(order) and not detectable(v[e], v[order[i + 1]])
                cells.append(f"{e} {fmt(v[e])}{' ≈' if tie else ''}")
            lines.append(f"| {b} | {s} | {params / 1e6:.2f}M | " + " | ".join(cells) + " |")
    lines += ["\n(≈: no detectable difference from the next one, Welch 95% on the loss)\n",
              "**Kendall's τ between the rankings** (95% bootstrap interval over seeds) and the pairs that flip\n",
              "| compared | at | τ | flips |", "|---|---|---|---|"]
    for L in lengths:
        for b in budgets:
            for s, t in itertools.combinations(sizes, 2):
                tau, low, high = kendall(values(b, s, L), values(b, t, L))
                lines.append(f"| {s} → {t} ({b}) | ppl@{L} | {tau:+.2f} [{low:+.2f}, {high:+.2f}] | "
                             f"{'; '.join(flips(values(b, s, L), values(b, t, L))) or 'none'} |")
        for s in sizes:
            if len(budgets) > 1:
                u, v = values(budgets[0], s, L), values(budgets[-1], s, L)
                tau, low, high = kendall(u, v)
                lines.append(f"| {budgets[0]} → {budgets[-1]} ({s}) | ppl@{L} | {tau:+.2f} [{low:+.2f}, {high:+.2f}] | "
                             f"{'; '.join(flips(u, v)) or 'none'} |")
    return "\n".join(lines + ["", wall(runs)])


def budget_table(runs: Sequence[Run], task: str) -> str:
    groups = by(runs, "encoding", "budget")
    lengths = sorted({int(k.rsplit("@", 1)[1]) for r in runs for k in (r.summary or {})
                      if k.startswith(f"tasks/{task}/accuracy@")})
    lines = [f"| encoding | budget | steps | seeds | val/loss (1×) | " + " | ".join(f"{L}" for L in lengths) + " |",
             "|---|---|---|---|---|" + "---:|" * len(lengths)]
    for (encoding, budget), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r.seed)
        cells = []
        for L in lengths:
            acc = [100 * r.metric(f"tasks/{task}/accuracy@{L}") for r in rs]
            mean = float(np.mean(acc))
            low, high = stats.t.interval(0.95, len(acc) - 1, loc=mean, scale=stats.sem(acc)) \
                if len(acc) > 1 and np.std(acc) > 0 else (mean, mean)
            cells.append(f"{mean:.0f} [{max(low, 0):.0f}, {min(high, 100):.0f}] ({'/'.join(f'{a:.0f}' for a in acc)})")
        loss = [r.metric("val/loss") for r in rs]
        steps = rs[0].summary.get("steps", "?")
        lines.append(f"| {encoding} | {budget} | {steps} | {len(rs)} | {np.mean(loss):.3f} ({'/'.join(f'{x:.3f}' for x in loss)}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines + ["", wall(runs)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["recipe", "ladder", "budget"])
    parser.add_argument("sweeps", type=Path, nargs="+")
    parser.add_argument("--task", default="flip_flop")
    parser.add_argument("--sizes", default="micro,mini,midi,tiny,small,base")
    args = parser.parse_args()
    runs = completed(args.sweeps)
    if args.table == "recipe":
        print(recipe_table(runs, 64, 1024))
    elif args.table == "ladder":
        print(ladder_tables(runs, [64, 1024], args.sizes.split(",")))
    else:
        print(budget_table(runs, args.task))
