"""Interrupting a sweep as a user does: one Ctrl-C stops it whole, and the command it prints,
pasted from its log into a shell, finishes it. Output goes to files (no terminal), as in a log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TINY, cli_env, run_cli, warm_bin

from posenc.config import parse_overrides
from posenc.display.commands import hydra_value, override
from posenc.record.directory import read_jsonl
from posenc.record.rundir import load_checkpoint

pytestmark = pytest.mark.slow  # signals sent to sweeps running in processes of their own

MAX_STEPS = 40
SWEEP = ["train", "-m", "encoding=rope,nope,alibi", *TINY, f"trainer.max_steps={MAX_STEPS}",
         "trainer.checkpoint_interval=1000"]  # the only checkpoint before the end is the one Ctrl-C saves


def shell_env(tmp_path: Path) -> dict[str, str]:
    """cli_env with `posenc` on PATH, for commands pasted into bash (each a fork of a warm
    interpreter, tests/warm_posenc.py: none of them is signalled)."""
    env = cli_env()
    env.pop("COLUMNS")  # no terminal and no COLUMNS: where rich would fall back to 80 columns
    env["PATH"] = f"{warm_bin()}{os.pathsep}{env['PATH']}"
    return env


def interrupt_sweep(cwd: Path, sig: int, env: dict[str, str]) -> tuple[int, str, str]:
    """The sweep in its own process group, sent sig once job 0's train.log shows a training step:
    a terminal's Ctrl-C reaches the whole group (here the warm client, tests/warm_posenc.py, which
    passes it on to the command). Returns (exit code, stdout, stderr), read from files."""
    out, err = cwd / "stdout.log", cwd / "stderr.log"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([str(warm_bin() / "posenc"), *SWEEP], cwd=cwd, env=env, stdout=stdout,
                                stderr=stderr, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline and not any("step 1/" in p.read_text()
                                                   for p in cwd.glob("outputs/sweeps/*/*/0_*/train.log")):
            time.sleep(0.02)
        os.killpg(proc.pid, sig)
        code = proc.wait(timeout=120)
    return code, out.read_text(), err.read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_one_signal_stops_the_sweep_and_its_printed_command_finishes_it(tmp_path: Path, sig: int):
    env = shell_env(tmp_path)
    code, stdout, stderr = interrupt_sweep(tmp_path, sig, env)
    assert code == 128 + sig, stderr[-2000:]
    [sweep] = list(tmp_path.glob("outputs/sweeps/*/*"))
    [job0] = [p for p in sweep.iterdir() if p.is_dir()]  # jobs 1 and 2 never started: no directory
    assert job0.name == "0_encoding=rope"
    stopped_at = load_checkpoint(job0 / "checkpoints" / "last.safetensors", tensors=False)["step"]
    assert 0 < stopped_at < MAX_STEPS and not (job0 / "summary.json").exists()
    assert f"  interrupted: job 0 (encoding=rope), checkpoint at step {stopped_at}\n" in stdout
    assert "  never started: job 1 (encoding=nope); job 2 (encoding=alibi)\n" in stdout
    assert stderr.strip().splitlines()[-1].startswith(f"interrupted: sweep stopped by {signal.Signals(sig).name} (0 of 3 ")
    # no log line cut across lines: the run dir's INFO line holds the whole path
    assert f"INFO     run dir: {job0}\n" in stdout
    # train.log's own line for the job pastes too: Hydra reads back the job's directory
    line = next(line for line in (job0 / "train.log").read_text().splitlines() if "interrupted: " in line)
    pasted = line.split("continue with `", 1)[1].rstrip("`")
    assert pasted == f"posenc train {override('trainer.resume', job0)}"
    printed = subprocess.run(["bash", "-c", f"printf '%s\\n' {pasted.removeprefix('posenc train ')}"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert parse_overrides([printed])[0].value == str(job0)
    if sig != signal.SIGINT:
        return

    [resume] = [line.removeprefix("resume the sweep: ") for line in stdout.splitlines()
                if line.startswith("resume the sweep: ")]
    result = subprocess.run(["bash", "-c", resume], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [r.name for r in runs] == ["0_encoding=rope", "1_encoding=nope", "2_encoding=alibi"]
    for run in runs:
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"
        steps = [row["step"] for row in read_jsonl(run / "metrics.jsonl") if "train/loss" in row]
        assert steps == list(range(1, MAX_STEPS + 1))  # each step logged once: job 0 went on from its checkpoint
    assert f"resumed at step {stopped_at} " in (job0 / "train.log").read_text()
    # its next step, pasted from the same output, runs too
    [compare] = [line.removeprefix("compare them: ") for line in result.stdout.splitlines()
                 if line.startswith("compare them: ")]
    compared = subprocess.run(["bash", "-c", compare], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0 and (sweep / "report.md").is_file(), compared.stderr[-2000:]

    # once more: every job finished, none is trained again
    before = {r: (r / "summary.json").stat().st_mtime_ns for r in runs}
    again = subprocess.run(["bash", "-c", resume], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {r: (r / "summary.json").stat().st_mtime_ns for r in runs} == before
    assert again.stdout.count("completed already: kept, not re-run") == 3


def test_a_sweep_resume_may_not_change_the_experiment(tmp_path: Path):
    sweep = tmp_path / "outputs" / "sweeps" / "d" / "t_x,y"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    hydra: [hydra.mode=MULTIRUN]\n"
                                         "    task: ['encoding=rope,nope', model.n_layer=1]\n")
    result = run_cli("train", "-m", f"trainer.resume={hydra_value(sweep)}", "model.n_layer=2", cwd=tmp_path)
    assert result.returncode == 1
    assert "was not run with model.n_layer=2 (the sweep has 1)" in result.stderr
    result = run_cli("train", "-m", "trainer.resume=auto", cwd=tmp_path)
    assert result.returncode == 1 and "takes a sweep dir" in result.stderr
