"""Train short, test long (Press et al., 2022, Tables 2-3) at small scale, on CPU.

Runs `posenc train -m experiment=train_short_test_long` (sinusoidal, rope, t5_bias, alibi,
nope trained at one length, evaluated at 1-16× it), then writes into the sweep directory
  train_short_test_long.md   perplexity per encoding and evaluation length (markdown)
  train_short_test_long.png  perplexity against length, training length marked

    python scripts/train_short_test_long.py [extra Hydra overrides, e.g. trainer.max_steps=100]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from posenc.plots_length import find_summaries, plot_extrapolation, run_labels


def markdown_table(sweep_dir: Path) -> str:
    found = find_summaries([sweep_dir])
    labels = run_labels([s for _, s in found])
    lengths = [r["length"] for r in found[0][1]["extrapolation"]["lengths"]]
    seq_len = found[0][1]["seq_len"]
    header = "| encoding | " + " | ".join(f"{n} ({n / seq_len:g}×)" for n in lengths) + " | train tokens/s |"
    rows = [header, "|" + "---|" * (len(lengths) + 2)]
    for label, (_, s) in sorted(zip(labels, found), key=lambda t: t[0]):
        by_len = {r["length"]: r["ppl"] for r in s["extrapolation"]["lengths"]}
        cells = [f"{by_len[n]:.2f}" if by_len.get(n) is not None else "n/a" for n in lengths]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {s['tokens_per_s']:,.0f} |")
    note = (f"\nValidation perplexity (byte-level, pystdlib) of models trained at {seq_len} tokens, "
            f"evaluated on the same validation tokens at each length (non-overlapping windows).\n")
    return "\n".join(rows) + "\n" + note


def main(extra: list[str]) -> None:
    sweep_dir = Path("outputs/sweeps/train_short_test_long") / time.strftime("%Y-%m-%d_%H-%M-%S")
    cmd = [sys.executable, "-m", "posenc", "train", "-m", "experiment=train_short_test_long",
           f"hydra.sweep.dir={sweep_dir}", *extra]
    print("running:", " ".join(cmd), flush=True)
    started = time.time()
    code = subprocess.call(cmd)
    table = markdown_table(sweep_dir)
    (sweep_dir / "train_short_test_long.md").write_text(table)
    png = plot_extrapolation([sweep_dir], sweep_dir / "train_short_test_long.png")
    print(table)
    print(f"wrote {sweep_dir / 'train_short_test_long.md'} and {png} in {time.time() - started:.0f} s")
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
