"""The probe figure of docs/model_recipe.md (issue 26): RoPE under several block recipes, side by side.

    python scripts/recipe_probe.py SWEEP... --recipes llama,gpt2 --out docs/figures/recipe_rope_probe.png

For every RoPE run of the experiment=recipe_ablation sweeps given whose recipe is listed (run dirs
written before safetensors checkpoints: `posenc convert RUN` first), one forward of
the same validation windows at 1×, 4× and 16× the training length T (posenc.eval.probes, as
`posenc probe` computes them), then per recipe, mean over seeds (thin lines: each seed):

- left: the logit amplitude each RoPE frequency pair can contribute, √(E‖q_i‖²·E‖k_i‖²)/√head_dim
  (the pair's term of q·k/√d is at most |q_i||k_i|/√d; Barbero et al., ICLR 2025, read the same
  per-pair norms), per layer, against the pair's frequency θ_i; pairs left of the dashed line
  turn less than once over T positions, so past T they rotate to angles never seen in training;
- right: mean attention entropy (nats) per layer against the context length.

Prints the numbers behind the figure as a Markdown table.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from posenc.eval.probes import probe_lengths
from posenc.eval.run import load_trained
from posenc.report.runs import find_runs

MULTIPLES = (1, 4, 16)


def probe(run_dir: Path, windows: int) -> tuple[dict, int]:
    cfg, data, model, _, _ = load_trained(run_dir, [])
    T = int(cfg.trainer.seq_len)
    idx = {}
    for m in MULTIPLES:
        w = np.asarray(data.validation[: windows * m * T], dtype=np.int64).reshape(windows, m * T)
        idx[m * T] = torch.from_numpy(w)
    with torch.no_grad():
        return probe_lengths(model, idx), T


def pair_amplitude(rotary: dict) -> np.ndarray:
    """(layers, pairs): √(E‖q_i‖²·E‖k_i‖²)/√head_dim, the RMS logit amplitude of pair i."""
    q, k = np.asarray(rotary["q_sq_norm"]), np.asarray(rotary["k_sq_norm"])
    return np.sqrt(q * k) / math.sqrt(2 * q.shape[-1])


def main(sweeps: list[Path], recipes: list[str], out: Path, windows: int, encoding: str) -> None:
    from posenc.display.figures import pyplot, save_figure

    plt = pyplot()

    amplitude, entropy, theta, T = defaultdict(list), defaultdict(list), None, None
    for run in find_runs(sweeps):
        recipe = str(run.value("recipe"))
        if not run.ok or str(run.value("encoding")) != encoding or recipe not in recipes:
            continue
        probes, T = probe(run.path, windows)
        theta = np.asarray(probes[str(T)]["rotary"]["theta"])
        amplitude[recipe].append(pair_amplitude(probes[str(T)]["rotary"]))
        entropy[recipe].append([[float(np.mean(p["entropy"][layer])) for p in probes.values()]
                                for layer in range(len(probes[str(T)]["entropy"]))])
    turn = 2 * math.pi / T  # θ_i below this: less than one turn over T positions
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    colours = dict(zip(recipes, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = ["-", "--", ":", "-."]
    lengths = [m * T for m in MULTIPLES]
    print(f"| recipe | seeds | layer | logit amplitude, pairs with θ_i·T < 2π | all pairs | entropy @{lengths[0]} | "
          f"@{lengths[1]} | @{lengths[2]} |\n|---|---|---|---|---|---|---|---|")
    for recipe in recipes:
        s, e = np.asarray(amplitude[recipe]), np.asarray(entropy[recipe])  # (seeds, layers, pairs), (seeds, layers, lengths)
        for layer in range(s.shape[1]):
            style = dict(color=colours[recipe], ls=styles[layer % len(styles)])
            left.plot(theta, s[:, layer].mean(0), marker=".", label=f"{recipe}, layer {layer}", **style)
            right.plot(lengths, e[:, layer].mean(0), marker="o", label=f"{recipe}, layer {layer}", **style)
            for seed in range(len(s)):
                left.plot(theta, s[seed, layer], lw=0.4, alpha=0.4, color=colours[recipe])
            slow, every = s[:, layer][:, theta < turn].sum(-1), s[:, layer].sum(-1)
            print(f"| {recipe} | {len(s)} | {layer} | {slow.mean():.2f} ({', '.join(f'{x:.2f}' for x in slow)}) | "
                  f"{every.mean():.2f} | "
                  + " | ".join(f"{e[:, layer, i].mean():.2f}" for i in range(len(lengths))) + " |")
    left.axvline(turn, color="grey", ls="--", lw=0.8)
    left.set(xscale="log", yscale="log", xlabel="pair frequency θ_i (rad / position)",
             ylabel="√(E‖q_i‖²·E‖k_i‖²) / √head_dim", title=f"{encoding}: logit amplitude per frequency pair (T={T})")
    right.axvline(T, color="grey", ls="--", lw=0.8)
    right.set(xscale="log", xlabel="context length", ylabel="mean attention entropy (nats)",
              title="attention entropy against length")
    right.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, out)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", type=Path, nargs="+")
    parser.add_argument("--recipes", default="llama,gpt2")
    parser.add_argument("--encoding", default="rope")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("docs/figures/recipe_rope_probe.png"))
    args = parser.parse_args()
    main(args.sweeps, args.recipes.split(","), args.out, args.windows, args.encoding)
