"""Train short, test long (Press et al., 2022, Tables 2-3) at small scale, on CPU.

Runs `posenc train -m experiment=train_short_test_long` (sinusoidal, rope, t5_bias, alibi,
nope trained at one length, evaluated at 1-16× it), then `posenc compare` on the sweep, which
writes into the sweep directory
  report.md / report.html  per encoding: final val ppl, ppl@<length> per evaluation length, tokens/s
  extrapolation.png        perplexity against length, training length marked (and the compare plots)

    python scripts/train_short_test_long.py [extra Hydra overrides, e.g. trainer.max_steps=100]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from posenc.report.compare import compare


def main(extra: list[str]) -> None:
    sweep_dir = Path("outputs/sweeps/train_short_test_long") / time.strftime("%Y-%m-%d_%H-%M-%S")
    cmd = [sys.executable, "-m", "posenc", "train", "-m", "experiment=train_short_test_long",
           f"hydra.sweep.dir={sweep_dir}", *extra]
    print("running:", " ".join(cmd), flush=True)
    started = time.time()
    code = subprocess.call(cmd)
    # failed runs are listed in the report, not averaged in; the script still exits with train's code
    compare([sweep_dir], metric="val/ppl", out=sweep_dir)
    print(f"done in {time.time() - started:.0f} s")
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
