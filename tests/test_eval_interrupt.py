"""An evaluation interrupted as a user interrupts it keeps what it finished: `posenc eval` in a
process of its own, sent Ctrl-C (SIGINT) once its first length's result is on disk, leaves a
readable record of that length that says what is missing, and the same command run again scores
only what is missing and ends where an uninterrupted evaluation ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TINY, cli_env, run_cli, run_dirs, warm_bin

pytestmark = pytest.mark.slow  # a Ctrl-C sent to an eval running in a process of its own

# 1× is quick; 8× with windows every 16 tokens is ~1,000 windows of 256 tokens, a second or more of
# work in which the signal lands (and then a per-position pass over the same windows)
EVAL = ["eval.lengths=[1,8]", "eval.stride=16"]


def interrupt_after_first_length(run: Path, record: Path, cwd: Path) -> tuple[int, str, str]:
    """`posenc eval RUN EVAL` in its own process group, sent SIGINT once record holds the 1× perplexity
    (as a terminal's Ctrl-C reaches the group). Returns (exit code, stdout, stderr)."""
    out, err = cwd / "stdout.log", cwd / "stderr.log"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([str(warm_bin() / "posenc"), "eval", str(run), *EVAL], cwd=cwd, env=cli_env(),
                                stdout=stdout, stderr=stderr, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if "extrapolation/ppl@32" in json.loads(record.read_text()):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=120)
    return code, out.read_text(), err.read_text()


def test_ctrl_c_keeps_the_finished_lengths_and_the_same_command_finishes_the_rest(tmp_path: Path):
    result = run_cli("train", *TINY, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [run] = run_dirs(tmp_path)
    record = run / "eval_lengths-1-8_stride-16.json"

    code, stdout, stderr = interrupt_after_first_length(run, record, tmp_path)
    assert code == 130, stderr[-2000:]
    stopped = json.loads(record.read_text())  # a valid JSON file, written before the signal
    assert stopped["complete"] is False and "extrapolation/ppl@256" not in stopped
    assert stopped["missing"][0] == "ppl at length 256 (8×)"
    assert [r["length"] for r in stopped["extrapolation"]["lengths"]] == [32]
    at_1x = stopped["extrapolation/ppl@32"]
    [line] = stderr.strip().splitlines()[-1:]
    assert line.startswith("interrupted: stopped by Ctrl-C: ") and "keeps ppl at 1×; missing ppl at 8×" in line
    command = line.split("run `", 1)[1].split("` again", 1)[0]
    assert command == f"posenc eval {run} \"eval.lengths=[1,8]\" eval.stride=16"
    assert not list(run.glob("*.tmp"))  # no half-written file beside it

    # the printed command, pasted: 1× is taken back, not scored again
    resumed = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             env={**cli_env(), "PATH": f"{warm_bin()}{os.pathsep}{os.environ['PATH']}"})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "ppl at length 32 (1×): ppl " in resumed.stdout and "(kept from the interrupted evaluation)" in resumed.stdout
    assert "ppl at length 32 (1×): started" not in resumed.stdout
    done = json.loads(record.read_text())
    assert done["complete"] is True and done["missing"] == []
    assert done["extrapolation/ppl@32"] == at_1x and done["extrapolation/ppl@256"] > 0
    positions = json.loads((run / "per_position_eval_lengths-1-8_stride-16.json").read_text())
    assert [r["length"] for r in positions["lengths"]] == [32, 256]

    # another checkpoint is another evaluation: an interrupted record is never mixed with it
    stopped["resume_key"] = "another"
    record.write_text(json.dumps(stopped))
    again = run_cli("eval", str(run), *EVAL, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "kept from the interrupted evaluation" not in again.stdout and "starting over" in again.stdout
    assert json.loads(record.read_text())["extrapolation/ppl@32"] == pytest.approx(at_1x, rel=1e-9)
