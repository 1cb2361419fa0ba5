"""Running a benchmark protocol for one encoding: each arm is a Hydra sweep over the protocol's
seeds (`posenc train -m experiment=<arm> <encoding overrides> seed=0,1,2`), through the same
run_hydra and pre-checks as `posenc train`, its runs under outputs/benchmark/. And regenerating
the shipped baselines: every shipped encoding's arms, `jobs` at a time in worker processes, each
(encoding, arm) kept under outputs/benchmark/<protocol>/regenerate/ as it finishes, so a stopped
regeneration re-run with the same command starts where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime
from multiprocessing import get_context
from pathlib import Path

from posenc.benchmark.data import Row
from posenc.benchmark.protocol import Arm, Protocol
from posenc.rundir import write_json_atomic

Echo = Callable[[str], None]


def arm_argv(arm: Arm, seeds: tuple[int, ...], encoding_args: list[str], config_dir: str | None,
             sweep_dir: Path) -> list[str]:
    """The `posenc train` argv of one arm: a sweep over the seeds, into sweep_dir."""
    flags = ["--config-dir", config_dir] if config_dir else []
    return [*flags, "-m", f"experiment={arm.experiment}", *arm.overrides, *encoding_args, f"seed={','.join(map(str, seeds))}",
            f"hydra.sweep.dir={sweep_dir}"]


def run_arm(arm: Arm, seeds: tuple[int, ...], encoding_args: list[str], config_dir: str | None,
            sweep_dir: Path) -> dict:
    """Train the arm's seeds; {"values": {metric: per-seed}, "wall_time_s": per-seed, "load_1m", "errors"}."""
    from hydra.core.utils import JobStatus

    from posenc.cli.explain import explain
    from posenc.cli.hydra_commands import check_run
    from posenc.cli.hydra_entry import parse_args, run_hydra

    returns = run_hydra(parse_args(arm_argv(arm, seeds, encoding_args, config_dir, sweep_dir)), check=check_run)
    summaries, errors = [], []
    for r in returns:
        summary = r._return_value if r.status != JobStatus.FAILED else {"status": "failed", "error": explain(r._return_value)}
        if not isinstance(summary, dict) or summary.get("status") == "failed":
            errors.append(f"{arm.name} seed {r.cfg.seed}: {(summary or {}).get('error', 'no summary')}")
            summary = {}
        summaries.append(summary)
    return {"values": {m: [s.get(m) for s in summaries] for m in arm.metrics},
            "wall_time_s": [s.get("wall_time_s") for s in summaries],
            "load_1m": [s.get("machine/load_1m") for s in summaries], "errors": errors}


def run_encoding(protocol: Protocol, label: str, encoding_args: list[str], config_dir: str | None,
                 root: Path, echo: Echo) -> Row:
    """Every arm of the protocol for one encoding; its runs under root/<arm>/."""
    parts = {}
    for i, arm in enumerate(protocol.arms, 1):
        echo(f"[{i}/{len(protocol.arms)}] {label}: arm {arm.name} (experiment={arm.experiment}), "
             f"seeds {','.join(map(str, protocol.seeds))} -> {root / arm.name}")
        parts[arm.name] = run_arm(arm, protocol.seeds, encoding_args, config_dir, root / arm.name)
    return merge(label, parts)


def merge(label: str, parts: dict[str, dict]) -> Row:
    """One row from its arms' results."""
    return Row(label, {m: v for part in parts.values() for m, v in part["values"].items()},
               {arm: part["wall_time_s"] for arm, part in parts.items()},
               [x for part in parts.values() for x in part["load_1m"]],
               [e for part in parts.values() for e in part["errors"]])


def stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


# --- regenerating the shipped rows ---------------------------------------------------------------
def _worker(protocol_source: str, arm_name: str, encoding: str, seed: int, sweep_dir: str, part_file: str,
            hash_: str) -> str:
    """One (encoding, arm, seed) in a worker process; its result written to part_file."""
    from posenc.benchmark.protocol import load_protocol

    protocol = load_protocol(protocol_source)
    arm = next(a for a in protocol.arms if a.name == arm_name)
    part = run_arm(arm, (seed,), [f"encoding={encoding}"], None, Path(sweep_dir))
    write_json_atomic(Path(part_file), {"hash": hash_, "encoding": encoding, "arm": arm_name, "seed": seed, **part})
    return part_file


def join_seeds(parts: list[dict]) -> dict:
    """One arm's result from its single-seed parts, in seed order."""
    return {"values": {m: [p["values"][m][0] for p in parts] for m in parts[0]["values"]},
            "wall_time_s": [p["wall_time_s"][0] for p in parts], "load_1m": [p["load_1m"][0] for p in parts],
            "errors": [e for p in parts for e in p["errors"]]}


def regenerate(protocol: Protocol, hash_: str, encodings: list[str], jobs: int, work: Path, echo: Echo) -> list[Row]:
    """Every (encoding, arm, seed) not already done under work/parts/ with this protocol hash, `jobs`
    at a time (one torch thread each: the runs are bit-identical at any thread count, and on a shared
    machine more one-thread processes get more of it); then the rows, in `encodings` order."""
    parts_dir = work / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)

    def part_file(enc: str, arm: Arm, seed: int) -> Path:
        return parts_dir / f"{enc}__{arm.name}__{seed}.json"

    def done(path: Path) -> bool:
        return path.is_file() and json.loads(path.read_text()).get("hash") == hash_

    every = [(enc, arm, seed) for enc in encodings for arm in protocol.arms for seed in protocol.seeds]
    todo = [job for job in every if not done(part_file(*job))]
    echo(f"regenerating {protocol.name}: {len(todo)} of {len(every)} runs to do, {jobs} at a time; parts in {parts_dir}")
    now = stamp().replace("/", "_")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the spawned workers before torch loads
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_worker, protocol.source, arm.name, enc, seed,
                               str(work / "runs" / enc / arm.name / f"{now}_seed{seed}"),
                               str(part_file(enc, arm, seed)), hash_): (enc, arm.name, seed) for enc, arm, seed in todo}
        for n, future in enumerate(as_completed(futures), 1):
            future.result()
            echo(f"done {n}/{len(todo)}: {' '.join(map(str, futures[future]))}")
    rows = []
    for enc in encodings:
        parts = {arm.name: join_seeds([json.loads(part_file(enc, arm, s).read_text()) for s in protocol.seeds])
                 for arm in protocol.arms}
        rows.append(merge(enc, parts))
    return rows
