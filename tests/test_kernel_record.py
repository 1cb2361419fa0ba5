"""Every run says how it ran: each layer kind's kernel path, whether the model ran
compiled, and every fallback with its reason and step, in summary.json, W&B (config and summary),
metrics.jsonl (an event at the step), a bench row (JSON and table) and `posenc compare`'s cost table;
each run of a process (a sweep's jobs, a bench's models) from the same kernel state.

The failures come from a real torch.compile with a backend that raises an H200's errors
(tests/compile_failures.py), FlexAttention planned on the CPU as on CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import conftest
import pytest
from compile_failures import FAIL_FIRST, SHARED_MEMORY_ERROR, flex_on_the_cpu
from conftest import TINY, run_cli, run_dirs

import posenc.cli.app  # noqa: F401 - installs the CLI's warning format before a test records warnings
from posenc import errors
from posenc.errors import PosencWarning
from posenc.nn import kernels
from posenc.record.tracking import Tracker

ONE_RUNG = 16 * 4 * (32 + 2 * 32)  # a device with room for one smaller configuration (test_kernel_fallback.py)


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch):
    """backend(name): FlexAttention on the CPU compiled by compile_failures.<name>, for commands run
    in this process too (their environment is conftest.cli_env's)."""
    monkeypatch.setattr(errors, "_WARNED", set())

    def use(name: str) -> None:
        flex_on_the_cpu(monkeypatch)
        monkeypatch.setattr(kernels, "DEFAULT_SHARED_MEMORY", ONE_RUNG)
        monkeypatch.setenv(kernels.BACKEND_VARIABLE, f"compile_failures:{name}")
        env = conftest.cli_env  # an in-process command's environment is cli_env's alone
        monkeypatch.setattr(conftest, "cli_env", lambda: {**env(), kernels.BACKEND_VARIABLE: f"compile_failures:{name}"})

    return use


def events(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("event")]


def test_a_compiled_run_whose_flex_forward_fails_finishes_compiled_and_records_it(workdir, failing, monkeypatch,
                                                                                 recwarn):
    """`posenc train trainer.compile=true` with t5_bias's FlexAttention failing to compile: the run
    finishes, the rest of the model compiled, and summary.json, the W&B run (config and summary) and
    metrics.jsonl name t5_bias's layer kind, its path and the fallback's step."""
    failing("flex_at_compile")
    wandb_seen: dict = {}
    finish = Tracker.finish

    def keep_wandb(self, exit_code=0):  # what the W&B run holds when it is finished
        if self.wandb_run is not None:
            wandb_seen.update(summary=dict(self.wandb_run.summary), config=dict(self.wandb_run.config))
        return finish(self, exit_code)

    monkeypatch.setattr(Tracker, "finish", keep_wandb)
    result = run_cli("train", *TINY, "encoding=t5_bias", "trainer.compile=true", "logger=wandb",
                     "logger.mode=offline", cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    [run_dir] = run_dirs(workdir)
    record = json.loads((run_dir / "summary.json").read_text())["kernels"]
    assert record["compiled"] and record["compile_asked"]  # the rest of the model stayed compiled
    assert record["layer_kinds"]["global"] == {"layers": [0], "encoding": "t5_bias", "mixer": "softmax", "path": "dense"}
    [fallback] = record["fallbacks"]
    assert (fallback["layer_kind"], fallback["encoding"], fallback["left"], fallback["took"], fallback["step"]) == \
        ("global", "t5_bias", "flex", "dense", 1)
    assert SHARED_MEMORY_ERROR in fallback["reason"]
    [event] = events(run_dir)
    assert event["step"] == 1 and event["kernels/fallback"] == fallback
    summary, config = wandb_seen["summary"], wandb_seen["config"]
    assert summary["kernels/layer_kinds/global/encoding"] == "t5_bias"
    assert summary["kernels/layer_kinds/global/path"] == "dense" and summary["kernels/fallbacks/0/step"] == 1
    assert summary["kernels/compiled"] is True and config["kernels"]["fallbacks"][0]["took"] == "dense"
    said = [str(w.message) for w in recwarn if issubclass(w.category, PosencWarning)]
    assert len([s for s in said if s.startswith("FlexAttention for the global layers (encoding 't5_bias'")]) == 1, said
    evaluated = run_cli("eval", str(run_dir), "eval.lengths=[1]", cwd=workdir)  # eval.json and its output say it too
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    printed = " ".join(evaluated.stdout.split())
    assert "kernels: global=dense, uncompiled" in printed  # the evaluation's own (eager; its FlexAttention fails too)
    assert "evaluation fell back: global (t5_bias): flex → dense: NoTritonConfigsError" in printed
    assert "training fell back: global (t5_bias): flex → dense at step 1" in printed
    [written] = run_dir.glob("eval_*.json")
    assert json.loads(written.read_text())["kernels"]["layer_kinds"]["global"]["path"] == "dense"


def test_a_sweeps_second_job_starts_from_the_same_kernels_and_records_its_own_path(workdir, failing, monkeypatch):
    """Two jobs in one process (the basic launcher): the first job's FlexAttention fails to compile
    and falls back to the dense path; the second starts from torch's FlexAttention again, compiles,
    and its record says so, with no fallback inherited. Then `posenc compare` marks the first job's
    tokens/s as measured on another path."""
    failing("flex_at_compile_first")
    monkeypatch.setitem(FAIL_FIRST, "graphs", 2)  # torch's configuration, then the one smaller one
    result = run_cli("train", "-m", *TINY, "encoding=t5_bias", "seed=0,1", cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    records = {}
    for run_dir in run_dirs(workdir):
        summary = json.loads((run_dir / "summary.json").read_text())
        records[summary["seed"] if "seed" in summary else run_dir.name] = summary["kernels"]
    first, second = (records[k] for k in sorted(records))
    assert first["layer_kinds"]["global"]["path"] == "dense" and [f["took"] for f in first["fallbacks"]] == ["dense"]
    assert second["layer_kinds"]["global"]["path"] == "flex" and second["fallbacks"] == []

    compared = run_cli("compare", str(workdir / "outputs"), "--by", "seed", cwd=workdir)
    assert compared.returncode == 0, compared.stderr[-2000:]
    text = " ".join(compared.stdout.split())
    assert "global=dense, uncompiled ↓dense@1" in text and "global=flex, uncompiled" in text
    assert "tokens/s and MFU are not comparable across unlike paths" in text


def test_a_bench_row_that_fell_back_says_so_in_its_table_and_json(tmp_path, failing):
    from rich.console import Console

    from posenc.cli.bench import run_bench

    failing("flex_at_compile")
    out, log = tmp_path / "bench.json", tmp_path / "bench.log"
    with log.open("w") as stream:
        console = Console(file=stream, width=300)
        run_bench([*TINY, "bench.steps=1", "bench.rounds=1", "bench.warmup=1", "bench.reference=false",
                   "bench.encodings=[nope,t5_bias]", "--json", str(out)], console, console)
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    [fallback] = rows["t5_bias"]["kernels"]["fallbacks"]
    assert (fallback["layer_kind"], fallback["took"], fallback["step"]) == ("global", "dense", 1)
    assert rows["nope"]["kernels"]["fallbacks"] == [] and rows["nope"]["kernels"]["layer_kinds"]["global"]["path"]
    printed = log.read_text()
    assert "t5_bias ↓dense@1" in printed  # the row's mark
    assert "t5_bias fell back: global (t5_bias): flex → dense at step 1: NoTritonConfigsError" in printed
