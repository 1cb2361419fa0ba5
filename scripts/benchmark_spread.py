"""How far the benchmark protocol's values move with the CPU's code paths: the measurement the
protocol's tolerances come from (docs/leaderboard.md, "How far a value moves between CPUs").

Each setting runs a protocol arm for one encoding, every seed, in a process of its own whose
environment picks another of the paths a CPU's kernels take: ATen's vectorised kernels at
another instruction set (ATEN_CPU_CAPABILITY=default|avx2|avx512: what an older or an AMD CPU
runs), MKL's GEMM limited to AVX2 (MKL_ENABLE_INSTRUCTIONS: MKL's path on CPUs without AVX-512),
one torch thread or the machine's cores (how reductions split), oneDNN off; a setting joins them
('threads1+avx2'). Every value of
every seed under every setting goes into outputs/spread/<protocol>/spread.json, and the table
printed says how far each metric moved from the first setting (the machine as it is).

    python scripts/benchmark_spread.py --protocol posenc-pe-v2 --encoding rope
    python scripts/benchmark_spread.py --encoding rope --arm flip_flop --settings native,avx2,threads1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from posenc.leaderboard.protocol import load_protocol
from posenc.report.stats import scale_of
from posenc.record.rundir import RunDir

Z_999 = 3.29  # the normal quantile of a two-sided 99.9% band: a correct re-run fails 1 metric in 1,000

#: one change to the code path -> the environment that makes it; a setting joins them with '+'
#: ('threads1+avx2'), 'native' is the machine as it is (no_mkldnn: read by WRAPPER below)
PATHS: dict[str, dict[str, str]] = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "threads1": {"OMP_NUM_THREADS": "1"},
    "threads2": {"OMP_NUM_THREADS": "2"},
    "no_mkldnn": {"SPREAD_NO_MKLDNN": "1"},
}
SETTINGS = ("native", "threads1", "threads1+avx2", "threads1+default", "threads1+mkl_avx2", "threads1+avx2+mkl_avx2",
            "threads1+no_mkldnn", "avx2", "default")


def environment(setting: str) -> dict[str, str]:
    return {k: v for atom in setting.split("+") if atom != "native" for k, v in PATHS[atom].items()}


# `posenc train` with oneDNN switched off first where the setting asks (there is no variable for it)
WRAPPER = ("import os, sys, torch\n"
           "if os.environ.get('SPREAD_NO_MKLDNN'): torch.backends.mkldnn.enabled = False\n"
           "from posenc.cli import main\nsys.argv = ['posenc', *sys.argv[1:]]\nmain()\n")


def run_setting(name: str, arm, encoding: str, seeds: tuple[int, ...], out: Path) -> dict[str, list]:
    """The arm's seeds under one setting: metric -> per-seed values."""
    sweep = out / name / encoding / arm.name
    if not all(RunDir(sweep / str(i)).summary_file.is_file() for i in range(len(seeds))):
        env = {**os.environ, **environment(name), "WANDB_MODE": "disabled"}
        argv = ["train", "-m", f"experiment={arm.experiment}", *arm.overrides, f"encoding={encoding}",
                f"seed={','.join(map(str, seeds))}", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]
        subprocess.run([sys.executable, "-c", WRAPPER, *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    values: dict[str, list] = {m: [None] * len(seeds) for m in arm.metrics}
    for i in range(len(seeds)):
        run = RunDir(sweep / str(i))
        seed, summary = run.saved_config().seed, run.summary()
        for m in arm.metrics:
            values[m][seeds.index(seed)] = summary.get(m)
    return values


def shipped_row(protocol, encoding: str) -> dict[str, list] | None:
    """The shipped baselines' values of the encoding (metric -> per seed), where there are any."""
    from posenc.leaderboard.data import baselines_path, load_baselines

    if not baselines_path(protocol).is_file():
        return None
    return next((row.values for row in load_baselines(protocol).rows if row.label == encoding), None)


def spread(rows: dict[str, dict[str, list]], settings: list[str], metric: str) -> tuple[float, float]:
    """(sd of a seed's value across settings, pooled over seeds; sd across seeds, pooled over
    settings), relative to the value on a log-scale metric."""
    from statistics import fmean, pvariance, variance

    table = [rows[s][metric] for s in settings if metric in rows.get(s, {})]  # settings × seeds
    if any(v is None for r in table for v in r) or len(table) < 2:
        return 0.0, 0.0
    if scale_of(metric).log:
        table = [[math.log(v) for v in r] for r in table]
    by_seed = list(zip(*table))
    cpu = fmean(variance(col) for col in by_seed) ** 0.5
    seeds = fmean(variance(r) if len(r) > 1 else pvariance(r) for r in table) ** 0.5
    return cpu, seeds


def gap(a: float | None, b: float | None, metric: str) -> float | None:
    """How far b is from a: relative for a log-scale metric (perplexity), absolute otherwise."""
    if a is None or b is None:
        return None
    return abs(b - a) / abs(a) if scale_of(metric).log else abs(b - a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="posenc-pe-v2")
    parser.add_argument("--encoding", default="rope")
    parser.add_argument("--arm", default=None, help="one arm (default: every arm)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated, each 'native' or atoms joined by '+': " + ", ".join(PATHS))
    parser.add_argument("--out", default="outputs/spread")
    args = parser.parse_args()
    protocol = load_protocol(args.protocol)
    out = Path(args.out) / protocol.name
    settings = args.settings.split(",")
    record_file = out / "spread.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    for arm in protocol.arms:
        if args.arm and arm.name != args.arm:
            continue
        for name in settings:
            values = run_setting(name, arm, args.encoding, protocol.seeds, out)
            record.setdefault(args.encoding, {}).setdefault(name, {}).update(values)
            record_file.write_text(json.dumps(record, indent=1))
            print(f"{args.encoding} {arm.name} {name}: " + "  ".join(
                f"{protocol.metrics[m]} " + "/".join("—" if v is None else f"{v:.6g}" for v in vs)
                for m, vs in values.items()), flush=True)
    rows = dict(record[args.encoding])
    shipped = shipped_row(protocol, args.encoding)
    if shipped:  # the shipped values are one more machine: how far is each setting from them?
        rows["shipped"], settings = shipped, ["shipped", *settings]
    first = settings[0]
    print(f"\nlargest move from '{first}' over seeds {list(protocol.seeds)} (relative on perplexity, absolute on accuracy)")
    for m, label in protocol.metrics.items():
        if args.arm and protocol.arm_of(m).name != args.arm:
            continue
        moves = {s: max((g for a, b in zip(rows[first][m], rows[s][m]) if (g := gap(a, b, m)) is not None), default=0.0)
                 for s in settings[1:] if m in rows.get(s, {})}
        exact = {s: sum(a == b for a, b in zip(rows[first][m], rows[s][m])) for s in moves}
        print(f"  {label:>14}: " + "  ".join(f"{s} {v:.2g} ({exact[s]}/{len(protocol.seeds)} equal)"
                                          for s, v in moves.items()))
    print("\nspread: sd of one seed's value across the settings (pooled over seeds) against the sd across seeds "
          "(pooled over settings); a tolerance on the mean over n seeds that a re-run on another CPU path passes "
          "99.9% of the time, if a seed's value is a fresh draw there: 3.29 · sd_cpu · sqrt(2/n)")
    for m, label in protocol.metrics.items():
        if not (args.arm and protocol.arm_of(m).name != args.arm):
            cpu, seeds = spread(rows, settings, m)
            print(f"  {label:>14}: sd_cpu {cpu:.3g}  sd_seeds {seeds:.3g}  "
                  f"tolerance on the mean {Z_999 * cpu * (2 / len(protocol.seeds)) ** 0.5:.3g}")


if __name__ == "__main__":
    main()
