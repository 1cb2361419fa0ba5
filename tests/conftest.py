"""Shared test helpers: a tiny model/budget, and running the real `posenc` CLI."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml_memo


def _private_caches() -> Path:
    """Point every cache the suite could fill (posenc's packed data, Hugging Face, matplotlib,
    W&B, anything XDG) at one directory for this session, never the user's ~/.cache. Set before
    any test module imports posenc or huggingface_hub (they read some of these at import).
    POSENC_TEST_CACHE keeps a directory across sessions (the packed corpus takes ~15 s to build);
    otherwise a temporary one is removed at exit."""
    kept = os.environ.get("POSENC_TEST_CACHE")
    root = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="posenc-test-cache-"))
    if not kept:
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        # pytest-xdist's workers start from this process's environment: they share this one cache
        # (the packed corpus is built once; posenc/data/packing.py's rename makes a race harmless)
        os.environ["POSENC_TEST_CACHE"] = str(root)
    for var, sub in (("XDG_CACHE_HOME", "xdg"), ("POSENC_CACHE", "posenc"), ("HF_HOME", "huggingface"),
                     ("MPLCONFIGDIR", "matplotlib"), ("WANDB_CACHE_DIR", "wandb"),
                     ("WANDB_CONFIG_DIR", "wandb-config"), ("WANDB_DATA_DIR", "wandb-data")):
        os.environ[var] = str(root / sub)
    return root


TEST_CACHE = _private_caches()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): one worker per core this process may use, at most 6. Past
    that the longest end-to-end test sets the time, and each worker holds torch (~0.5 GB); a
    container whose CPU quota is smaller than the host it reports gets no more than 6 either."""
    return max(1, min(6, _cores()))


def _cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _threads_per_worker() -> int:
    """The CPU threads each test process may use: the machine's cores shared among pytest-xdist's
    workers. Two workers each running torch's default thread count on 2 cores oversubscribe them,
    and OpenMP's waiting threads then slow every test several-fold."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, _cores() // workers)


THREADS = _threads_per_worker()
# every run of the suite, in this process or one it starts, on THREADS torch threads: posenc's own
# choice on a loaded machine (posenc.hardware.choose_cpu_threads) would make two runs of one test
# differ in their last bits with the load of the moment (its own test asks for it)
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
yaml_memo.install()  # Hydra's composes parse each config text once per test process (tests/yaml_memo.py)
# in-process commands write to a stream that is no terminal; posenc's consoles are then wide
# (posenc/terminal.py) unless COLUMNS is set, which pytest-xdist's workers find set to 80
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)
if "PYTEST_XDIST_WORKER" in os.environ:
    import torch

    torch.set_num_threads(THREADS)

# a model and budget small enough for a whole run in a few seconds on 2 CPU cores
TINY = [
    "model.n_layer=1", "model.n_head=2", "model.d_model=32",
    "trainer.seq_len=32", "trainer.batch_size=4", "trainer.max_steps=4",
    "trainer.log_interval=1", "trainer.eval_interval=2", "trainer.early_evals=1", "trainer.eval_batches=2",
    "trainer.warmup_steps=1", "trainer.checkpoint_interval=2", "logger=none",
    "eval.at_end=false",  # the extrapolation evaluation has its own tests (test_extrapolation.py)
]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               COLUMNS="120", PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", str(THREADS))  # the worker's share of the cores (above)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def interrupt_training(args: list[str], cwd: Path, sig: int) -> tuple[int, str]:
    """`posenc train ARGS` in cwd, sent signal sig once its first checkpoint exists, as a user's
    Ctrl-C (SIGINT) or a scheduler's SIGTERM; returns (exit code, stderr). The command is a process
    of its own (a fork of the warm interpreter, tests/warm_posenc.py, which passes the signal on)."""
    import time

    proc = subprocess.Popen([str(warm_bin() / "posenc"), "train", *args], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(cwd.glob("outputs/*/*/checkpoints/last.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None,
            fresh_process: bool = False, new_python: bool = False) -> subprocess.CompletedProcess:
    """`posenc ARGS` as a user would type it, in directory cwd, with cli_env()'s environment.

    In this process by default (typer's CliRunner on posenc's own app, the same code the entry
    point runs): a new Python process costs ~5 s of imports (torch, its compiler for the
    optimiser, Hydra), which over the suite's ~100 commands was most of its time. A test whose
    point is a process of its own (its exit code and streams as a shell sees them, its own
    ``env``) asks for ``fresh_process=True`` or passes ``env``: a fork of a warm interpreter
    (tests/warm_posenc.py), posenc imported afresh under that environment. A test whose point
    is what a new interpreter reads at import (another HOME) asks for ``new_python=True``."""
    if new_python:
        return subprocess.run([sys.executable, "-m", "posenc", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=env or cli_env())
    if fresh_process or env is not None:
        return subprocess.run([str(warm_bin() / "posenc"), *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=env or cli_env())
    return _run_in_process(list(args), cwd)


def warm_bin() -> Path:
    """The directory of the warm `posenc` client (tests/warm_posenc.py), its server started by
    this test process's first call."""
    import warm_posenc

    from posenc.config.searchpath import ENV_VAR

    env = cli_env()
    env.pop(ENV_VAR, None)
    return warm_posenc.bin_dir(env)


def _run_in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    import traceback

    from typer.testing import CliRunner

    from posenc.cli.app import app

    saved_env, saved_cwd, env = dict(os.environ), os.getcwd(), cli_env()  # the env before it is cleared
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, args, prog_name="posenc")
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))  # what the process would print
    return subprocess.CompletedProcess(["posenc", *args], result.exit_code, result.stdout, stderr)


def run_dirs(cwd: Path) -> list[Path]:
    """Every run directory (one holding .hydra/) under cwd/outputs."""
    return sorted(p.parent for p in (cwd / "outputs").rglob(".hydra"))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def _posenc_configs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test composes with posenc's own configs: no plugin dir from the user's shell, and none
    left behind by an in-process command's --config-dir (it adds to POSENC_CONFIG_PATH for the
    process, posenc/config/searchpath.py); monkeypatch restores the variable after the test."""
    monkeypatch.delenv("POSENC_CONFIG_PATH", raising=False)


