"""scripts/gpu_check.sh, the one GPU check, on a CPU: its --dry-run, from a directory
outside the repository, prints every command the check runs — the CUDA tests, `posenc check`'s CUDA
rows for every encoding and hybrid layout, the bench and the 16x evaluation, the GPU and CPU
training runs — and composes each posenc command's config, so an override that names no key fails
here rather than minutes into the GPU machine's time; it runs and writes nothing."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
from conftest import cli_env

from posenc.config import group_options
from posenc.config.searchpath import ENV_VAR

pytestmark = pytest.mark.slow  # scripts/gpu_check.sh's dry run, a shell and the commands it composes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
HYBRIDS = ["hybrid", "jamba_like", "kimi_linear", "qwen3_next"]  # the layouts with a recurrent layer kind
BENCHED = "bench.encodings=[nope,rope,alibi,t5_bias,fox,path,stick_breaking]"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    cwd = tmp_path_factory.mktemp("elsewhere")
    env = cli_env()
    env.pop(ENV_VAR, None)  # posenc's own configs only (an in-process --config-dir of another module sets it)
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--install", "/wheels", str(cwd / "out")], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    return result, cwd


def test_the_dry_run_prints_every_command_and_composes_each_config(dry_run):
    result, cwd = dry_run
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    checks = [line for line in lines if line.startswith("posenc check --only cuda ")]
    assert [line.split()[4] for line in checks] == [f"encoding={e}" for e in group_options("encoding")] + \
        [f"layout={name}" for name in HYBRIDS]
    benches = [line for line in lines if line.startswith("posenc bench ")]
    assert any("model=base" in b and "trainer.seq_len=1024" in b and f"'{BENCHED}'" in b for b in benches)
    assert any("model=base" in b and "layout=qwen3_next" in b for b in benches)
    assert any("model=small" in b and "bench.eval_length_multiple=16" in b for b in benches)
    runs = [line for line in lines if "posenc train " in line]
    assert {(e, d) for e in ("nope", "t5_bias") for d in ("cuda", "cpu")} == \
        {(e, d) for line in runs for e in ("nope", "t5_bias") for d in ("cuda", "cpu")
         if f"encoding={e} " in line and f"device={d} " in line}
    assert all("trainer.max_steps=300" in line for line in runs) and len(runs) == 4
    assert any(line.startswith("python3 -m pytest -m cuda -n 4 ") and line.endswith(str(ROOT / "tests"))
               for line in lines)
    assert "--target /tmp/site '/wheels/*.whl'" in lines[0]
    assert lines[-1] == f"composed the config of {len(checks) + len(benches) + len(runs)} posenc commands " \
                        f"({len(checks)} check, {len(runs)} train, {len(benches)} bench)"
    assert not (cwd / "out").exists() and list(cwd.iterdir()) == []


@pytest.mark.parametrize("command, why", [
    ("posenc bench model=base trainer.seq_lenn=1024", "seq_lenn"),
    ("posenc bench bench.encodings=[nope,ropee]", "ropee"),
    ("posenc check --only cudaa encoding=rope", "cudaa"),
    ("env OMP_NUM_THREADS=4 posenc train encoding=t5_bias trainer.max_stepz=300", "max_stepz"),
])
def test_a_mistake_in_a_command_fails_the_composition_with_one_line(command, why, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check_plan", ROOT / "scripts" / "gpu_check_plan.py")
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    assert plan.compose_all(["posenc check --only cuda encoding=alibi", command]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {command}: ") and why in err and err.count("\n") == 1, err
