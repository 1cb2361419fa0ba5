"""The context-extension study's figure and table (scripts/context_extension_study.sh runs it).

Reads every run under the given paths (the `experiment=context_extension` sweeps, one per
parent seed), groups them by encoding.scaling × trainer.max_steps, and writes into OUT:
  context_extension.png  perplexity against length in units of the parent's T, one panel per
                         fine-tune state, one colour per method, mean ± std over seeds
  context_extension.md   the same numbers as a markdown table (the README's)

    python scripts/context_extension_plot.py OUT SWEEP_DIR [SWEEP_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from posenc.report.plots_length import length_stats  # noqa: E402
from posenc.report.runs import find_runs, group_runs  # noqa: E402

METHODS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")


def study(paths: list[Path]) -> tuple[int, dict[tuple[str, int], dict]]:
    """(T, {(method, fine-tune steps): {length: Stat}}); T is the parents' training length."""
    runs = [r for r in find_runs(paths) if r.ok]
    parents = {int(r.summary["parent"]["seq_len"]) for r in runs}
    if len(parents) != 1:
        raise SystemExit(f"expected one parent training length, got {sorted(parents)}")
    groups = group_runs(runs, ["encoding.scaling", "trainer.max_steps"])
    return parents.pop(), {(str(g.key[0]), int(g.key[1])): length_stats(g) for g in groups}


def table(T: int, stats: dict[tuple[str, int], dict]) -> str:
    lengths = sorted({n for s in stats.values() for n in s})
    n_seeds = max(st.n for s in stats.values() for st in s.values())
    head = ["method", "fine-tune"] + [f"{n // T}×T ({n})" for n in lengths]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for steps in sorted({k[1] for k in stats}):
        for method in METHODS:
            s = stats.get((method, steps))
            if s is None:
                continue
            cells = [f"{s[n].mean:.2f}" + (f" ± {s[n].std:.2f}" if n_seeds > 1 else "") if s[n].mean else "—"
                     for n in lengths]
            rows.append("| " + " | ".join([method, f"{steps} steps" if steps else "none", *cells]) + " |")
    return "\n".join(rows) + "\n"


def plot(T: int, stats: dict[tuple[str, int], dict], out: Path) -> Path:
    steps_list = sorted({k[1] for k in stats})
    fig, axes = plt.subplots(1, len(steps_list), figsize=(6 * len(steps_list), 4.5), sharey=True, squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, steps in zip(axes[0], steps_list):
        for i, method in enumerate(METHODS):
            s = stats.get((method, steps))
            if not s:
                continue
            xs = [n / T for n in sorted(s) if s[n].mean]
            ys = [s[n].mean for n in sorted(s) if s[n].mean]
            err = [s[n].std or 0 for n in sorted(s) if s[n].mean]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colours(i), label=method)
        ax.axvline(1, color="grey", ls="--", lw=1)
        ax.axvline(4, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        ax.set_xlabel(f"evaluation length (× T = {T}; dashed T, dotted 4T)")
        ax.set_title("no fine-tune" if steps == 0 else f"{steps}-step fine-tune at 4T")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation perplexity")
    axes[0][-1].legend(title="encoding.scaling")
    fig.tight_layout()
    path = out / "context_extension.png"
    fig.savefig(path, dpi=110)
    return path


def main(out: Path, paths: list[Path]) -> None:
    T, stats = study(paths)
    out.mkdir(parents=True, exist_ok=True)
    (out / "context_extension.md").write_text(table(T, stats))
    print(table(T, stats))
    print(f"wrote {plot(T, stats, out)} and {out / 'context_extension.md'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
