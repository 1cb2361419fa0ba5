"""What Hydra hands back from a `posenc train` run or sweep, read: each job's JobReturn, one line
per failed job, and at a sweep's end where it went and the `posenc compare` command for it."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus

from posenc.cli.common import console
from posenc.cli.explain import explain


def print_next_step(returns: list[JobReturn], swept: dict[str, list]) -> None:
    """Where a sweep went, and the `posenc compare` command for it (grouped by the swept keys)."""
    import shlex

    from posenc.report.runs import NOT_A_GROUP_KEY  # start-up: numpy, after the sweep
    from posenc.train import distributed  # start-up: loaded by the jobs already

    dirs = [Path(r.hydra_cfg.hydra.runtime.output_dir).parent for r in returns if r.hydra_cfg is not None]
    if not dirs or not distributed.is_main():
        return
    sweep_dir = dirs[0]
    try:
        sweep_dir = sweep_dir.relative_to(Path.cwd())
    except ValueError:
        pass
    by = "".join(f" --by {shlex.quote(k)}" for k in swept if k not in NOT_A_GROUP_KEY)
    console.print(f"sweep: [bold]{sweep_dir}[/] ({len(returns)} runs)", highlight=False, soft_wrap=True)
    console.print(f"compare them: posenc compare {shlex.quote(str(sweep_dir))}{by}", highlight=False, soft_wrap=True)


def job_returns(returned) -> list[JobReturn]:
    """The JobReturns in what a sweeper returned (the basic sweeper: one list per batch)."""
    if isinstance(returned, JobReturn):
        return [returned]
    if isinstance(returned, (list, tuple)):
        return [r for item in returned for r in job_returns(item)]
    return []


def outcome(r: JobReturn) -> object:
    """What the job returned, or the exception it raised and did not turn into a result. Hydra's
    JobReturn.return_value re-raises that exception, printing "Error executing job with overrides"
    to stderr first: posenc says it in its own line, so that print is kept off the terminal."""
    if r.status != JobStatus.FAILED:
        return r.return_value
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return r.return_value  # raises: a failed job's return_value is its exception, raised
        except BaseException as e:  # noqa: BLE001 - the job's own exception, handed back as its outcome
            return e


def failures(returns: list[JobReturn]) -> list[str]:
    """One line per failed job: 'job N (overrides): what went wrong'."""
    out = []
    for r in returns:
        returned = outcome(r)
        if isinstance(returned, BaseException):  # an exception the task did not turn into a result
            error = explain(returned)
        elif isinstance(returned, dict) and returned.get("status") == "failed":
            error = returned.get("error")
        else:
            continue
        num = r.hydra_cfg.hydra.job.num if r.hydra_cfg is not None else "?"
        shown = [o for o in r.overrides or [] if not o.startswith("name=")]  # the sweep's name, not the job's
        out.append(f"job {num} ({' '.join(shown)}): {error}")
    return out
