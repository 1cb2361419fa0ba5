"""The tables of docs/transfer.md and docs/model_recipe.md (issue 26) from sweep directories.

    python scripts/transfer_tables.py recipe SWEEP...   # experiment=recipe_ablation: ppl growth 64 -> 1024 per recipe
    python scripts/transfer_tables.py ladder SWEEP...   # experiment=scale_ladder: rankings per size and budget, Kendall τ, flips
    python scripts/transfer_tables.py budget SWEEP...   # experiment=tasks_budget: flip-flop exact match per budget

A formatter over posenc's own statistics, so every number is the one `posenc compare` prints
(`posenc compare SWEEP --by encoding --within model` for one budget's ladder): perplexity means
are geometric with the t-interval of the loss mapped back (posenc.report.stats.aggregate), a
difference is "detectable" where Welch's 95% interval excludes none (compare_to_baseline), ranks
and Kendall's τ with their intervals and the flips come from posenc.report.ranking.
What compare does not do: the growth ppl@16T / ppl@T per seed (the recipe table), one table for
all sizes × budgets (the ladder), accuracy with every seed's value (the budget table).
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from posenc.report.ranking import rank_agreement, rank_groups
from posenc.report.runs import Run, find_runs
from posenc.report.stats import NO_DIFFERENCE, Scale, aggregate, compare_to_baseline, detectable

RECIPES = ["llama", "llama_tied_head", "llama_gpt2_init", "llama_gelu", "llama_layernorm", "llama_bias", "gpt2",
           "gpt2_untied_head", "gpt2_fan_in_init", "gpt2_swiglu", "gpt2_rmsnorm", "gpt2_no_bias"]
LOG = Scale(log=True)
ACCURACY = Scale(low=0.0, high=100.0)


def fmt(values: Sequence[float], scale: Scale = LOG, digits: int = 2) -> str:
    s = aggregate(values, scale)
    return f"{s.mean:.{digits}f}" if s.low is None else f"{s.mean:.{digits}f} [{s.low:.{digits}f}, {s.high:.{digits}f}]"


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
    growth_of = lambda rs: [r.metric(f"extrapolation/ppl@{long}") / r.metric(f"extrapolation/ppl@{short}")  # noqa: E731
                            for r in rs]
    for encoding in sorted({k[0] for k in groups}):
        lines += [f"\n**{encoding}** (growth = ppl@{long} / ppl@{short}; vs flavour: ratio of the geometric-mean "
                  f"growth to that of the flavour the row switches one component of (llama_* to llama, gpt2_* to "
                  f"gpt2), Welch 95% on the log)\n",
                  f"| recipe | seeds | ppl@{short} | ppl@{long} | growth ×{long // short} length | per seed | vs flavour |",
                  "|---|---|---|---|---|---|---|"]
        for recipe in RECIPES:
            rs = sorted(groups.get((encoding, recipe), []), key=lambda r: r.seed)
            if not rs:
                continue
            p_short = [r.metric(f"extrapolation/ppl@{short}") for r in rs]
            p_long = [r.metric(f"extrapolation/ppl@{long}") for r in rs]
            growth = [b / a for a, b in zip(p_short, p_long)]
            flavour = recipe.split("_")[0]
            base = growth_of(groups.get((encoding, flavour), []))
            versus = "—"
            if recipe != flavour and len(base) > 1 and len(growth) > 1:
                d = compare_to_baseline(growth, base, higher_is_better=False, scale=LOG)
                verdict = "no detectable difference" if d.verdict == NO_DIFFERENCE else "detectable"
                versus = f"{d.diff:.2f} [{d.low:.2f}, {d.high:.2f}] {verdict}"
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
        lines += [f"\n**ppl@{L}**: encodings ranked within each size and budget (geometric mean [95% interval], "
                  "rank interval (pairwise Welch 95%) in braces when it is not a single rank)\n",
                  "| budget | size | params | 1st | 2nd | 3rd | 4th | 5th |", "|---|---|---|---|---|---|---|---|"]
        for b, s in itertools.product(budgets, sizes):
            v = values(b, s, L)
            ranking = rank_groups(v, higher_is_better=False, log=True)
            cells = []
            for i, r in enumerate(ranking.ranks):
                nxt = ranking.ranks[i + 1].label if i + 1 < len(ranking.ranks) else None
                tie = " ≈" if nxt and not detectable(v[r.label], v[nxt], LOG) else ""
                spread = "" if r.low == r.high else f" {{{r.low:.0f}–{r.high:.0f}}}"
                cells.append(f"{r.label} {fmt(v[r.label])}{spread}{tie}")
            params = groups[(b, s, ranking.ranks[0].label)][0].metric("params")
            lines.append(f"| {b} | {s} | {params / 1e6:.2f}M | " + " | ".join(cells) + " |")
    lines += ["\n(≈: no detectable difference from the next one, Welch 95% on the loss)\n",
              "**Kendall's τ between rankings** (95% bootstrap interval over seeds) and the pairs whose order flips\n",
              "| compared | metric | τ | flips (confident: both orders detectable) |", "|---|---|---|---|"]
    for L in lengths:
        for b in budgets:
            lines += [_agreement_row(a, f"{a.u} → {a.v} ({b})", L)
                      for a in rank_agreement({s: values(b, s, L) for s in sizes}, higher_is_better=False, log=True)]
        if len(budgets) > 1:
            for s in sizes:
                lines += [_agreement_row(a, f"{a.u} → {a.v} ({s})", L)
                          for a in rank_agreement({b: values(b, s, L) for b in budgets}, higher_is_better=False, log=True)]
    return "\n".join(lines + ["", wall(runs)])


def _agreement_row(a, label: str, L: int) -> str:
    tau = "n/a" if a.tau is None else f"{a.tau:+.2f} [{a.low:+.2f}, {a.high:+.2f}]"
    flips = "; ".join(f"{f.first} ahead at {a.u}, {f.second} at {a.v} ({'confident' if f.confident else 'within noise'})"
                      for f in a.flips)
    return f"| {label} | ppl@{L} | {tau} | {flips or 'none'} |"


def budget_table(runs: Sequence[Run], task: str) -> str:
    groups = by(runs, "encoding", "budget")
    lengths = sorted({int(k.rsplit("@", 1)[1]) for r in runs for k in (r.summary or {})
                      if k.startswith(f"tasks/{task}/accuracy@")})
    lines = ["| encoding | budget | steps | seeds | val/loss (1×) | " + " | ".join(f"{L}" for L in lengths) + " |",
             "|---|---|---|---|---|" + "---:|" * len(lengths)]
    for (encoding, budget), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r.seed)
        cells = []
        for L in lengths:
            acc = [100 * r.metric(f"tasks/{task}/accuracy@{L}") for r in rs]
            cells.append(f"{fmt(acc, ACCURACY, 0)} ({'/'.join(f'{a:.0f}' for a in acc)})")
        loss = [r.metric("val/loss") for r in rs]
        steps = rs[0].summary.get("steps", "?")
        lines.append(f"| {encoding} | {budget} | {steps} | {len(rs)} | {sum(loss) / len(loss):.3f} ({'/'.join(f'{x:.3f}' for x in loss)}) | "
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
