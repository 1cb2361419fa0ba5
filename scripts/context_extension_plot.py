"""The context-extension study's figure and table (scripts/context_extension_study.sh runs it).

Reads every run under the given paths (the `experiment=context_extension` sweeps, one per
parent seed), groups them by encoding.scaling × trainer.max_steps, and writes into OUT:
  context_extension.png  perplexity against length in units of the parent's T, one panel per
                         fine-tune state, one colour per method, mean ± std over seeds
  context_extension.md   the same numbers as a markdown table (docs/context_extension.md's)
On the passkey arm (experiment=context_extension_passkey: runs with tasks/passkey/accuracy@<len>)
the same figure and table show exact-match accuracy in % instead of perplexity, as
context_extension_passkey.png / .md.

    python scripts/context_extension_plot.py OUT SWEEP_DIR [SWEEP_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from posenc.display.figures import pyplot, save_figure

plt = pyplot()
from posenc.record.metrics import TASK_ACCURACY  # noqa: E402
from posenc.report.plots_length import length_stats  # noqa: E402
from posenc.report.runs import Group, find_runs, group_runs  # noqa: E402
from posenc.report.stats import Stat, aggregate  # noqa: E402

METHODS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")


def passkey_stats(group: Group) -> dict[int, Stat]:
    """length -> passkey exact-match accuracy in % (mean ± std over the group's completed seeds)."""
    lengths = sorted({int(m["length"]) for r in group.completed for k in r.summary
                      if (m := TASK_ACCURACY.match(k)) and m["task"] == "passkey"})
    stats = {}
    for n in lengths:
        key = TASK_ACCURACY.key(task="passkey", length=n)
        values = [r.metric(key) for r in group.completed if key in r.summary]
        stats[n] = aggregate([None if v is None else 100 * v for v in values])
    return stats


def study(paths: list[Path]) -> tuple[int, bool, dict[tuple[str, int], dict]]:
    """(T, passkey?, {(method, fine-tune steps): {length: Stat}}); T is the parents' training
    length; on the passkey arm the Stats are accuracy in %, else perplexity."""
    runs = [r for r in find_runs(paths) if r.ok]
    parents = {int(r.summary["parent"]["seq_len"]) for r in runs}
    if len(parents) != 1:
        raise SystemExit(f"expected one parent training length, got {sorted(parents)}")
    passkey = any(TASK_ACCURACY.match(k) for r in runs for k in r.summary)
    stats_of = passkey_stats if passkey else length_stats
    groups = group_runs(runs, ["encoding.scaling", "trainer.max_steps"])
    return parents.pop(), passkey, {(str(g.key[0]), int(g.key[1])): stats_of(g) for g in groups}


def table(T: int, stats: dict[tuple[str, int], dict], digits: int = 2) -> str:
    lengths = sorted({n for s in stats.values() for n in s})
    n_seeds = max(st.n for s in stats.values() for st in s.values())
    head = ["method", "fine-tune"] + [f"{n // T}×T ({n})" for n in lengths]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for steps in sorted({k[1] for k in stats}):
        for method in METHODS:
            s = stats.get((method, steps))
            if s is None:
                continue
            cells = [f"{s[n].mean:.{digits}f}" + (f" ± {s[n].std:.{digits}f}" if n_seeds > 1 else "")
                     if s[n].mean is not None else "—" for n in lengths]
            rows.append("| " + " | ".join([method, f"{steps} steps" if steps else "none", *cells]) + " |")
    return "\n".join(rows) + "\n"


def plot(T: int, stats: dict[tuple[str, int], dict], out: Path, passkey: bool = False) -> Path:
    steps_list = sorted({k[1] for k in stats})
    fig, axes = plt.subplots(1, len(steps_list), figsize=(6 * len(steps_list), 4.5), sharey=True, squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, steps in zip(axes[0], steps_list):
        for i, method in enumerate(METHODS):
            s = stats.get((method, steps))
            if not s:
                continue
            defined = [n for n in sorted(s) if s[n].mean is not None]
            xs = [n / T for n in defined]
            ys = [s[n].mean for n in defined]
            err = [s[n].std or 0 for n in defined]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colours(i), label=method)
        ax.axvline(1, color="grey", ls="--", lw=1)
        ax.axvline(4, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        ax.set_xlabel(f"evaluation length (× T = {T}; dashed T, dotted 4T)")
        ax.set_title("no fine-tune" if steps == 0 else f"{steps}-step fine-tune at 4T")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("passkey exact match (%)" if passkey else "validation perplexity")
    axes[0][-1].legend(title="encoding.scaling")
    fig.tight_layout()
    return save_figure(fig, out / f"{stem(passkey)}.png")


def stem(passkey: bool) -> str:
    return "context_extension_passkey" if passkey else "context_extension"


def main(out: Path, paths: list[Path]) -> None:
    T, passkey, stats = study(paths)
    out.mkdir(parents=True, exist_ok=True)
    text = table(T, stats, digits=0 if passkey else 2)
    (out / f"{stem(passkey)}.md").write_text(text)
    print(text)
    print(f"wrote {plot(T, stats, out, passkey)} and {out / f'{stem(passkey)}.md'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
