"""The documents study's cross-evaluation table: every run scored on windows cut both ways.

    posenc eval RUN_DIR eval.packing=documents     # for each concat-trained run (and =concat for the others)
    python scripts/cross_packing_table.py SWEEP_DIR... [--lengths 256 4096]

Each run's own packing comes from its summary.json (the run's end-of-training evaluation), the
other packing from its eval_packing-<other>.json; cells are posenc compare's (posenc.report.stats:
the geometric mean over seeds and the 95% t-interval of the mean log, mapped back).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from posenc.record.metrics import EXTRAPOLATION_PPL
from posenc.report.stats import aggregate, scale_of
from posenc.report.tables import format_stat
from posenc.record.rundir import RunDir


def scored(run: RunDir) -> list[tuple[str, str, str, dict]]:
    """(encoding, trained on, scored on, metrics) for the run's own evaluation and each re-evaluation."""
    summary = run.summary() or {}
    if summary.get("status") != "completed":
        return []
    encoding, packing = summary["encoding"]["name"], summary["packing"]
    out = [(encoding, packing, packing, summary)]
    for path in sorted(run.path.glob("eval_packing-*.json")):  # `posenc eval RUN dataset.packing=<other>`
        out.append((encoding, packing, path.stem.removeprefix("eval_packing-"), json.loads(path.read_text())))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 4096])
    args = parser.parse_args()
    cells: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for sweep in args.sweeps:
        for run in RunDir.under(sweep):
            for encoding, trained, scored_on, metrics in scored(run):
                cells[(encoding, trained, scored_on)].append(metrics)
    keys = [EXTRAPOLATION_PPL.key(length=n) for n in args.lengths]
    print("| encoding | trained on | scored on | seeds | " + " | ".join(keys) + " |")
    print("|---|---|---|---|" + "---|" * len(keys))
    for (encoding, trained, scored_on), runs in sorted(cells.items()):
        stats = [format_stat(aggregate([m.get(k) for m in runs], scale_of(k)), ".3f") for k in keys]
        print(f"| {encoding} | {trained} | {scored_on} | {len(runs)} | " + " | ".join(stats) + " |")


if __name__ == "__main__":
    main()
