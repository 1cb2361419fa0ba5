"""torchrun with 2 CPU processes (gloo): one run directory, the tokens of a global batch of
2 × trainer.batch_size per step, and the same training and validation as one process with twice
the batch; with gradient accumulation, one all-reduce per optimizer step. The number of processes
is part of the run: a resume on another number is refused with the torchrun command that resumes
it, and an interrupt says that command once."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY, cli_env, run_cli, run_dirs, warm_bin
from posenc.record.directory import read_jsonl
from posenc.record.rundir import RunDir

pytestmark = pytest.mark.slow  # two ranks under torchrun


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """torchrun's command for `posenc ARGS` on nproc CPU processes: `--no-python` runs the warm
    posenc client (tests/warm_posenc.py) as each rank's command instead of a new `python -m posenc`
    (each rank still a process of its own, torchrun's environment and all)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "--no-python",
            str(warm_bin() / "posenc"), *args]


def val_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "val/ppl" in r]


@pytest.fixture(scope="module")
def two_ranks_and_one(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a 2-rank TINY run at trainer.batch_size=4, one process's at 8: the same global batch)."""
    cwd = tmp_path_factory.mktemp("ddp")
    result = subprocess.run(torchrun("train", *TINY, "device=cpu"), cwd=cwd / ".", capture_output=True, text=True,
                            timeout=300, env=cli_env())
    assert result.returncode == 0, result.stderr[-3000:]
    (cwd / "torchrun.log").write_text(result.stdout + result.stderr)
    [ddp_dir] = run_dirs(cwd)
    (cwd / "single").mkdir()
    single = run_cli("train", *TINY, "device=cpu", "trainer.batch_size=8", cwd=cwd / "single")
    assert single.returncode == 0, single.stderr[-3000:]
    [single_dir] = run_dirs(cwd / "single")
    return ddp_dir, single_dir


def test_torchrun_two_processes_one_run(two_ranks_and_one: tuple[Path, Path]) -> None:
    run_dir, single_dir = two_ranks_and_one
    summary = json.loads((run_dir / "summary.json").read_text())
    steps, batch, seq_len = 4, 4, 32  # from TINY
    assert summary["tokens"] == steps * 2 * batch * seq_len
    assert (summary["world_size"], summary["global_batch"]) == (2, 2 * batch)  # how it ran, in the run
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # rank 0 alone logs

    # one process with the global batch: the same windows, the same averaged gradients
    single_rows = read_jsonl(single_dir / "metrics.jsonl")
    assert [r["tokens"] for r in rows] == [r["tokens"] for r in single_rows]
    for ddp_row, one_row in zip(rows, single_rows):
        assert ddp_row["train/loss"] == pytest.approx(one_row["train/loss"], rel=1e-4)


def test_a_two_rank_run_says_its_world_size_and_warns_of_nothing_torch_deprecates(
        two_ranks_and_one: tuple[Path, Path]) -> None:
    """What torchrun prints: the end-of-run table names the processes and the global batch, and no
    rank prints torch's FutureWarning about DDP's deprecated broadcast_buffers (posenc passes what
    the installed torch asks for instead)."""
    run_dir, _ = two_ranks_and_one
    log = (run_dir.parents[2] / "torchrun.log").read_text()
    assert re.search(r"world size \(processes\)\s*│\s*2 \(global batch 8\)", log), log[-3000:]
    assert "FutureWarning" not in log and "broadcast_buffers" not in log


def test_validation_on_two_ranks_is_one_process_validation_at_the_same_global_batch(
        two_ranks_and_one: tuple[Path, Path]) -> None:
    """Each evaluation scores eval_batches × the global batch windows, shared out over the ranks and
    summed: the same targets as one process's, so val/loss, val/ppl and the convergence figures
    read the same at any number of processes (they were 27.2 against 32.9 when each rank scored
    eval_batches × its own batch, the same windows on both)."""
    ddp_dir, single_dir = two_ranks_and_one
    ddp, one = val_rows(ddp_dir), val_rows(single_dir)
    assert [r["step"] for r in ddp] == [r["step"] for r in one] == [2, 4]
    for a, b in zip(ddp, one):
        for key in ("val/loss", "val/ppl", "val/bpb"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    ddp_summary, one_summary = (json.loads((d / "summary.json").read_text()) for d in (ddp_dir, single_dir))
    assert ddp_summary["convergence/val_loss_auc"] == pytest.approx(one_summary["convergence/val_loss_auc"], rel=1e-5)
    assert one_summary["world_size"] == 1 and one_summary["global_batch"] == ddp_summary["global_batch"]


def test_a_plain_resume_of_a_two_rank_run_is_refused_with_the_torchrun_command(
        two_ranks_and_one: tuple[Path, Path], tmp_path: Path) -> None:
    ddp_dir, _ = two_ranks_and_one
    header = RunDir(ddp_dir).load_checkpoint("last", tensors=False)
    assert (header["world_size"], header["per_node"], header["global_batch"]) == (2, 2, 8)
    before = {p: p.stat().st_mtime_ns for p in ddp_dir.rglob("*") if p.is_file()}
    result = run_cli("train", f"trainer.resume={ddp_dir}", "trainer.max_steps=8", cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"error: trainer.resume: {ddp_dir} trained on 2 processes at a global batch of 8")
    assert f"`torchrun --standalone --nproc_per_node=2 -m posenc train trainer.resume={ddp_dir}`" in lines[0]
    assert "trainer.resume_reshape=true" in lines[0]
    assert {p: p.stat().st_mtime_ns for p in ddp_dir.rglob("*") if p.is_file()} == before  # refused: nothing written


def test_a_resume_that_reshapes_on_request_is_recorded(two_ranks_and_one: tuple[Path, Path], tmp_path: Path) -> None:
    """trainer.resume_reshape=true continues the 2-rank run on one process at the same global
    batch (batch_size 8): the same windows per step, and the run says it changed."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(two_ranks_and_one[0], run_dir)
    result = run_cli("train", f"trainer.resume={run_dir}", "trainer.max_steps=6", "trainer.resume_reshape=true",
                     "trainer.batch_size=8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["world_size"] == 1 and summary["global_batch"] == 8
    assert summary["reshapes"] == [{"step": 4, "tokens": 1024, "from": {"world_size": 2, "global_batch": 8},
                                    "to": {"world_size": 1, "global_batch": 8}}]
    assert RunDir(run_dir).load_checkpoint("last", tensors=False)["reshapes"] == summary["reshapes"]

    # where runs are compared, the reshaped one is named; and runs at different global batches are flagged
    compared = run_cli("compare", str(run_dir), str(two_ranks_and_one[1]), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "1 run(s) resumed on another number of processes or global batch" in " ".join(compared.stdout.split())
    from posenc.report.caveats import batch_lines
    from posenc.report.runs import Run

    runs = [Run(Path(f"r{b}"), {}, {}, {"status": "completed", "global_batch": b}) for b in (8, 16)]
    assert batch_lines(runs)[0].startswith("the runs trained at different global batches (8, 16 windows a step")
    assert batch_lines(runs[:1]) == []


def test_an_interrupted_two_rank_run_says_once_how_to_continue_and_continues_there(tmp_path: Path) -> None:
    """SIGINT to the ranks (a scheduler's signal, or a terminal's Ctrl-C as the ranks see it): the
    checkpoint is saved, rank 0 alone prints the line, naming torchrun; the workers exit 0, so
    torchrun prints no ChildFailedError report (nor restarts them with --max-restarts). The
    command pasted continues the run to the end, with the losses of the uninterrupted run."""
    run = [*TINY, "device=cpu", "trainer.max_steps=40", "trainer.checkpoint_interval=5", "trainer.eval_interval=20"]
    proc = subprocess.Popen(torchrun("train", *run), cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob("outputs/*/*/checkpoints/last.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(ranks) == 2, ranks
    for pid in ranks:
        subprocess.run(["kill", "-INT", pid])
    _, stderr = proc.communicate(timeout=120)
    [run_dir] = run_dirs(tmp_path)
    said = [line for line in stderr.splitlines() if "stopped by SIGINT" in line]
    assert len(said) == 1 and said[0].startswith("error: stopped by SIGINT at step"), stderr[-3000:]
    assert proc.returncode == 0 and "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr[-3000:]
    printed = said[0].split("`")[1]
    assert printed == f"torchrun --standalone --nproc_per_node=2 -m posenc train trainer.resume={run_dir}"

    words = shlex.split(printed)
    resumed = subprocess.run(torchrun(*words[words.index("posenc") + 1:]), cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, env=cli_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 41))  # every step once
    (tmp_path / "single").mkdir()
    assert run_cli("train", *run, "trainer.batch_size=8", cwd=tmp_path / "single").returncode == 0
    [single] = run_dirs(tmp_path / "single")
    for a, b in zip(val_rows(run_dir), val_rows(single), strict=True):
        assert a["val/ppl"] == pytest.approx(b["val/ppl"], rel=1e-5)


def test_accumulation_all_reduces_once_per_optimizer_step_and_trains_as_one_process(tmp_path: Path) -> None:
    """grad_accum=4 under DDP: every bucket of gradients is all-reduced once per optimizer step,
    in the backward of its last micro-batch (no_sync before it), not once per micro-batch. What is
    counted: calls of a DDP communication hook that wraps the default all-reduce; DDP calls it once
    per gradient bucket per synchronised backward (this 1-layer model fits one bucket). And the
    result is one process's with the same global batch: the same losses and parameters."""
    worker = Path(__file__).with_name("ddp_accumulation_worker.py")
    steps, grad_accum, global_batch = 3, 4, 8
    args = [str(steps), str(grad_accum), str(global_batch)]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "--no-python", str(warm_bin() / "python-script"), str(worker), str(tmp_path / "ddp"), *args],
                         capture_output=True, text=True, timeout=300, env=cli_env())
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    from ddp_accumulation_worker import main  # one process needs no launcher: in this one

    main(tmp_path / "one", steps, grad_accum, global_batch)

    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    calls = [tuple(c) for c in result["calls"]]
    buckets = sorted({bucket for _, _, bucket in calls})
    assert buckets == [0]  # one bucket: one all-reduce per optimizer step
    assert calls == [(step, grad_accum - 1, 0) for step in range(steps)]  # in the last micro-batch only

    single = json.loads((tmp_path / "one" / "result.json").read_text())
    assert single["calls"] == []  # one process: no DDP, nothing to reduce
    assert result["losses"] == pytest.approx(single["losses"], rel=1e-5)
    theirs, ours = load_file(tmp_path / "one" / "params.safetensors"), load_file(tmp_path / "ddp" / "params.safetensors")
    assert theirs.keys() == ours.keys()
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_two_rank_run_of_an_unshipped_variant_measures_its_verdict_on_rank_0_alone(tmp_path: Path) -> None:
    # no shipped verdict for this base: rank 0 measures it inside the process group, and its resume
    # row's training steps must not wait in collectives rank 1 never joins (they did: 30 min, then failed)
    result = subprocess.run(torchrun("train", *TINY, "device=cpu", "trainer.max_steps=2", "encoding=rope",
                                     "encoding.base=1234"),
                            cwd=tmp_path, capture_output=True, text=True, timeout=240, env=cli_env())
    assert result.returncode == 0, result.stderr[-3000:]
    [run_dir] = run_dirs(tmp_path)
    check = json.loads((run_dir / "summary.json").read_text())["check"]
    assert (check["from"], check["holds"]) == ("measured", True), check
    assert "fails posenc check" not in result.stderr
