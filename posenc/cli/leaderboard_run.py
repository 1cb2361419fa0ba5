"""Running a benchmark protocol for one encoding: each arm is a Hydra sweep over the protocol's
seeds (`posenc train -m experiment=<arm> <encoding overrides> seed=0,1,2`), through the same
run_hydra and pre-checks as `posenc train`, its runs under outputs/leaderboard/. And regenerating
the shipped baselines: every shipped encoding's runs, `jobs` at a time in worker processes, each
(encoding, arm, seed) kept under outputs/leaderboard/<protocol>/regenerate/parts/ as it finishes, so a
stopped regeneration re-run with the same command starts where it stopped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from datetime import datetime
from multiprocessing import get_context
from pathlib import Path

from posenc.cli.explain import explain
from posenc.cli.hydra_argv import parse_args
from posenc.cli.hydra_commands import check_run
from posenc.cli.hydra_entry import run_hydra
from posenc.cli.job_returns import outcome
from posenc.errors import UserError
from posenc.config import compose
from posenc.leaderboard.data import Row
from posenc.leaderboard.eta import Clock, measure
from posenc.leaderboard.protocol import Arm, Protocol, load_protocol
from posenc.record import kernel_record
from posenc.record.directory import write_json_atomic

#: where the benchmark's runs land, under the working directory (as `posenc train`'s outputs/)
OUTPUTS = Path("outputs") / "leaderboard"

Echo = Callable[[str], None]


def arm_argv(arm: Arm, seeds: tuple[int, ...], encoding_args: list[str], config_dir: str | None,
             sweep_dir: Path) -> list[str]:
    """The `posenc train` argv of one arm: a sweep over the seeds, into sweep_dir."""
    flags = ["--config-dir", config_dir] if config_dir else []
    quoted = "'" + str(sweep_dir).replace("\\", "\\\\").replace("'", "\\'") + "'"  # a label's `=` or `,` stays a path
    return [*flags, "-m", f"experiment={arm.experiment}", *arm.overrides, *encoding_args, f"seed={','.join(map(str, seeds))}",
            f"hydra.sweep.dir={quoted}"]


def run_arm(arm: Arm, seeds: tuple[int, ...], encoding_args: list[str], config_dir: str | None,
            sweep_dir: Path) -> dict:
    """Train the arm's seeds; {"values": {metric: per-seed}, "wall_time_s": per-seed, "load_1m", "errors",
    "kernels": per-seed paths and fallbacks}."""

    with one_torch_thread():
        returns = run_hydra(parse_args(arm_argv(arm, seeds, encoding_args, config_dir, sweep_dir)), check=check_run)
    summaries, errors = [], []
    for r in returns:
        summary = outcome(r)
        if isinstance(summary, BaseException):  # an exception the task did not turn into a result
            summary = {"status": "failed", "error": explain(summary)}
        if not isinstance(summary, dict) or summary.get("status") == "failed":
            errors.append(f"{arm.name} seed {r.cfg.seed}: {(summary or {}).get('error', 'no summary')}")
            summary = {}
        summaries.append(summary)
    return {"values": {m: [s.get(m) for s in summaries] for m in arm.metrics},
            "wall_time_s": [s.get("wall_time_s") for s in summaries],
            "load_1m": [s.get("machine/load_1m") for s in summaries], "errors": errors,
            "kernels": [kernel_record.brief(s.get(kernel_record.KEY)) for s in summaries]}


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Every arm runs on one torch thread, as --regenerate's workers do (OMP_NUM_THREADS=1): a
    thread count splits reductions differently, and the flip-flop arm turns a last-bit difference
    into other accuracies, so on the machine that made the data a re-run is bit-identical only at
    the same count (docs/leaderboard.md). The micro model gains little from a second thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_arms(protocol: Protocol, encoding_args: list[str]) -> Clock:
    """Each arm's run measured on this machine now, as the arms run (one torch thread): the placement's
    clock (posenc/leaderboard/eta.py)."""
    with one_torch_thread():
        paces = [measure(compose([f"experiment={arm.experiment}", *arm.overrides, *encoding_args,
                                  f"seed={protocol.seeds[0]}"], bench=False), arm.name) for arm in protocol.arms]
    return Clock(paces, len(protocol.seeds))


def run_encoding(protocol: Protocol, label: str, encoding_args: list[str], config_dir: str | None,
                 root: Path, echo: Echo, clock: Clock | None = None) -> Row:
    """Every arm of the protocol for one encoding; its runs under root/<arm>/. clock: the placement's
    ETA, said again as each arm ends."""
    parts = {}
    for i, arm in enumerate(protocol.arms, 1):
        echo(f"[{i}/{len(protocol.arms)}] {label}: arm {arm.name} (experiment={arm.experiment}), "
             f"seeds {','.join(map(str, protocol.seeds))} -> {root / arm.name}")
        started = time.monotonic()
        parts[arm.name] = run_arm(arm, protocol.seeds, encoding_args, config_dir, root / arm.name)
        if clock is not None:
            clock.arm_done(arm.name, time.monotonic() - started)
            echo(clock.progress() if i < len(protocol.arms) else clock.summary())
    return merge(label, parts)


def merge(label: str, parts: dict[str, dict]) -> Row:
    """One row from its arms' results."""
    return Row(label, {m: v for part in parts.values() for m, v in part["values"].items()},
               {arm: part["wall_time_s"] for arm, part in parts.items()},
               [x for part in parts.values() for x in part["load_1m"]],
               [e for part in parts.values() for e in part["errors"]],
               kernels={arm: part["kernels"] for arm, part in parts.items() if any(part.get("kernels", []))})


def stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


# --- regenerating the shipped rows ---------------------------------------------------------------
def _worker(protocol_source: str, arm_name: str, encoding: str, seed: int, sweep_dir: str, part_file: str,
            hash_: str) -> str:
    """One (encoding, arm, seed) in a worker process; its result written to part_file. Skipped when
    another regeneration sharing the directory has done it or is doing it (a live process's claim)."""

    if not claim(Path(part_file), hash_):
        return part_file
    protocol = load_protocol(protocol_source)
    arm = next(a for a in protocol.arms if a.name == arm_name)
    try:
        part = run_arm(arm, (seed,), [f"encoding={encoding}"], None, Path(sweep_dir))
    except Exception as e:  # noqa: BLE001 - recorded in the row (and retried by the next regeneration)

        part = {"values": {m: [None] for m in arm.metrics}, "wall_time_s": [None], "load_1m": [None],
                "errors": [f"{arm.name} seed {seed}: {explain(e)}"], "kernels": [""]}
    write_json_atomic(Path(part_file), {"hash": hash_, "encoding": encoding, "arm": arm_name, "seed": seed, **part})
    return part_file


def is_done(part: Path, hash_: str) -> bool:
    """Measured under this hash without an error (a failed part is run again)."""
    if not part.is_file():
        return False
    saved = json.loads(part.read_text())
    return saved.get("hash") == hash_ and not saved.get("errors")


def claim(part: Path, hash_: str) -> bool:
    """Whether this process may run the part: not done, and not claimed by another live process
    (part.claim holds its pid). Lets two regenerations share a directory without running a part twice."""
    if is_done(part, hash_):
        return False
    claim_file = part.with_suffix(".claim")
    try:
        owner = int(claim_file.read_text())
        os.kill(owner, 0)            # raises if that process is gone
        if owner != os.getpid():
            return False
    except (OSError, ValueError):
        pass
    claim_file.write_text(str(os.getpid()))
    return True


def _own_session() -> None:
    try:
        os.setsid()
    except OSError:  # already a session leader (or not allowed): the worker runs all the same
        pass


def join_seeds(parts: list[dict]) -> dict:
    """One arm's result from its single-seed parts, in seed order."""
    return {"values": {m: [p["values"][m][0] for p in parts] for m in parts[0]["values"]},
            "wall_time_s": [p["wall_time_s"][0] for p in parts], "load_1m": [p["load_1m"][0] for p in parts],
            "kernels": [p.get("kernels", [""])[0] for p in parts],
            "errors": [e for p in parts for e in p["errors"]]}


def regenerate(protocol: Protocol, hash_: str, encodings: list[str], jobs: int, work: Path, echo: Echo) -> list[Row]:
    """Every (encoding, arm, seed) not already done under work/parts/ with this protocol hash, `jobs`
    at a time (one torch thread each, as every arm runs: one_torch_thread; and on a shared
    machine more one-thread processes get more of it); then the rows, in `encodings` order."""
    parts_dir = work / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)

    def part_file(enc: str, arm: Arm, seed: int) -> Path:
        return parts_dir / f"{enc}__{arm.name}__{seed}.json"

    every = [(enc, arm, seed) for enc in encodings for arm in protocol.arms for seed in protocol.seeds]
    todo = [job for job in every if not is_done(part_file(*job), hash_)]
    echo(f"regenerating {protocol.name}: {len(todo)} of {len(every)} runs to do, {jobs} at a time; parts in {parts_dir}")
    now = stamp().replace("/", "_")
    calls = [(protocol.source, arm.name, enc, seed, str(work / "runs" / enc / arm.name / f"{now}_seed{seed}"),
              str(part_file(enc, arm, seed)), hash_) for enc, arm, seed in todo]
    if jobs == 1:  # in this process, one after another
        for n, call in enumerate(calls, 1):
            _worker(*call)
            echo(f"done {n}/{len(todo)}: {' '.join(map(str, call[2:4]))} {call[1]}")
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the spawned workers before torch loads
        # each worker its own session: where the kernel groups CPU time by session (autogroup), `jobs`
        # workers get `jobs` shares, not one between them
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_own_session) as pool:
            futures = {pool.submit(_worker, *call): call for call in calls}
            for n, future in enumerate(as_completed(futures), 1):
                future.result()
                call = futures[future]
                echo(f"done {n}/{len(todo)}: {' '.join(map(str, call[2:4]))} {call[1]}")
    missing = [str(part_file(*job)) for job in every if not part_file(*job).is_file()]
    if missing:
        raise UserError(f"{len(missing)} runs have no result yet (another regeneration sharing {parts_dir} is "
                        f"running them, or they were stopped), e.g. {missing[0]} — run the same command again")
    rows = []
    for enc in encodings:
        parts = {arm.name: join_seeds([json.loads(part_file(enc, arm, s).read_text()) for s in protocol.seeds])
                 for arm in protocol.arms}
        rows.append(merge(enc, parts))
    return rows
