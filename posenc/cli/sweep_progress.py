"""A sweep's progress where its jobs run in other processes (submitit, SLURM, any launcher but
Hydra's basic one): each job's step and ETA, read from the job's own run directory.

Hydra's basic launcher runs the jobs in the CLI's process, and each prints its progress itself.
A launcher that runs them elsewhere leaves the CLI waiting on their results, and each job's lines
land in its train.log only (a 13-minute submitit sweep printed its launch lines, then nothing).
So while the launcher waits, a thread reads every started job's ``metrics.jsonl`` (the step, the
losses, the seconds of training) and ``summary.json`` (finished or failed), and prints one line per
job: when it first logs, at most every ``EVERY_S`` seconds after that, and when it ends. The ETA is
the job's pace over the rows it wrote in this sweep (a resumed job's earlier rows do not count).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.record.metrics import ELAPSED, STEP, TRAIN_LOSS, VAL_PPL
from posenc.record.rundir import RunDir
from posenc.record.sweepdir import SweepDir

#: Hydra's launcher that runs every job in this process: its jobs print their own progress
IN_PROCESS = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
#: seconds between two progress lines of one job (its first and last line come when they happen)
EVERY_S = 30.0
#: seconds between two reads of the sweep directory
POLL_S = 2.0


@dataclass
class JobSeen:
    """What the watcher knows of one job: its pace's origin and when it last printed."""
    base_step: int              # the last step logged before this sweep ran (0: a fresh job)
    base_elapsed: float         # its seconds of training then
    printed_at: float = 0.0     # monotonic time of its last line (0: none yet)
    last_step: int = -1
    done: bool = False


def runs_elsewhere(cfg: DictConfig) -> bool:
    """Whether the sweep's launcher runs its jobs in other processes."""
    return OmegaConf.select(cfg, "hydra.launcher._target_", default=IN_PROCESS) != IN_PROCESS


@contextmanager
def watch_jobs(sweep_dir: Path, cfg: DictConfig, say: Callable[[str], None]) -> Iterator[None]:
    """While the body runs, report the jobs of the sweep in sweep_dir (a launcher that runs them
    elsewhere only); say prints a line."""
    if not runs_elsewhere(cfg):
        yield
        return
    watcher = SweepWatcher(Path(sweep_dir), say)
    thread = threading.Thread(target=watcher.run, name="posenc-sweep-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        watcher.stop.set()
        thread.join(timeout=POLL_S + 5)
        try:
            watcher.poll()  # the jobs' last lines, once the launcher returned
        except Exception:  # noqa: BLE001 - progress is for people: never the reason a sweep fails
            pass


class SweepWatcher:
    def __init__(self, sweep_dir: Path, say: Callable[[str], None]) -> None:
        self.sweep, self.say = SweepDir(sweep_dir), say
        self.stop = threading.Event()
        self.seen: dict[int, JobSeen] = {}
        self.before: dict[int, tuple[int, float]] = {}  # a resumed sweep's jobs: where each had got to
        for num in self.sweep.job_numbers():
            if (run := self.sweep.job(num)) is not None:
                self.before[num] = last_logged(run)
                if (run.summary() or {}).get("status") == "completed":  # kept, not run again: nothing to report
                    self.seen[num] = JobSeen(*self.before[num], done=True)

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a file mid-write: read it again at the next poll
                continue

    def poll(self) -> None:
        now = time.monotonic()
        for num in self.sweep.job_numbers():
            run = self.sweep.job(num)
            if run is None:
                continue
            seen = self.seen.get(num)
            if seen is None:
                step, elapsed = self.before.get(num, (0, 0.0))
                seen = self.seen[num] = JobSeen(step, elapsed)
            if seen.done:
                continue
            line = self.line(num, run, seen, now)
            if line is not None:
                self.say(line)

    def line(self, num: int, run: RunDir, seen: JobSeen, now: float) -> str | None:
        """The job's line, when it is due: its end, its first logged step, or EVERY_S since the last."""
        name = f"job {num} ({job_label(run)})"
        summary = run.summary()
        if summary is not None:
            seen.done = True
            status = summary.get("status")
            if status == "completed":
                ppl = summary.get(VAL_PPL.name)
                return f"{name}: finished" + (f", {VAL_PPL.name} {ppl:.3f}" if isinstance(ppl, (int, float)) else "")
            return f"{name}: {status or 'ended'}" + (f" — {summary['error']}" if summary.get("error") else "")
        rows = run.metrics()
        if not rows:
            return None
        last = rows[-1]
        step = int(last.get(STEP, 0))
        if step == seen.last_step or step <= seen.base_step or (seen.printed_at and now - seen.printed_at < EVERY_S):
            return None
        seen.printed_at, seen.last_step = now, step
        max_steps = OmegaConf.select(run.saved_config(), "trainer.max_steps", default=None) \
            if run.config_file.is_file() else None
        parts = [f"step {step}/{max_steps if max_steps is not None else '?'}"]
        loss = next((r[TRAIN_LOSS.name] for r in reversed(rows) if r.get(TRAIN_LOSS.name) is not None), None)
        ppl = next((r[VAL_PPL.name] for r in reversed(rows) if r.get(VAL_PPL.name) is not None), None)
        if loss is not None:
            parts.append(f"train loss {loss:.4f}")
        if ppl is not None:
            parts.append(f"val ppl {ppl:.2f}")
        eta = time_left(seen, step, last.get(ELAPSED.name), max_steps)
        parts.append(f"ETA {eta}")
        return f"{name}: " + "  ".join(parts)


def last_logged(run: RunDir) -> tuple[int, float]:
    """(step, seconds of training) of a job's last row before this sweep ran: a resumed job's pace
    is measured from there."""
    rows = run.metrics()
    if not rows:
        return 0, 0.0
    return int(rows[-1].get(STEP, 0)), float(rows[-1].get(ELAPSED.name) or 0.0)


def time_left(seen: JobSeen, step: int, elapsed: float | None, max_steps) -> str:
    """'0:01:10': the steps left at the pace of this sweep's steps of the job ('-' before it can tell)."""
    if elapsed is None or not isinstance(max_steps, int) or step <= seen.base_step or elapsed <= seen.base_elapsed:
        return "-"
    per_step = (float(elapsed) - seen.base_elapsed) / (step - seen.base_step)
    return str(timedelta(seconds=round(per_step * max(0, max_steps - step))))


def job_label(run: RunDir) -> str:
    """What the job's directory says of it: '0_base=500_seed=1' -> 'base=500_seed=1'."""
    return run.path.name.partition("_")[2] or run.path.name
