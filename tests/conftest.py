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
    for var, sub in (("XDG_CACHE_HOME", "xdg"), ("POSENC_CACHE", "posenc"), ("HF_HOME", "huggingface"),
                     ("MPLCONFIGDIR", "matplotlib"), ("WANDB_CACHE_DIR", "wandb"),
                     ("WANDB_CONFIG_DIR", "wandb-config"), ("WANDB_DATA_DIR", "wandb-data")):
        os.environ[var] = str(root / sub)
    return root


TEST_CACHE = _private_caches()

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
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def interrupt_training(args: list[str], cwd: Path, sig: int) -> tuple[int, str]:
    """`posenc train ARGS` in cwd, sent signal sig once its first checkpoint exists, as a user's
    Ctrl-C (SIGINT) or a scheduler's SIGTERM; returns (exit code, stderr)."""
    import time

    proc = subprocess.Popen([sys.executable, "-m", "posenc", "train", *args], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(cwd.glob("outputs/*/*/checkpoints/last.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`posenc ARGS` in a subprocess, as a user would type it, in directory cwd."""
    return subprocess.run([sys.executable, "-m", "posenc", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or cli_env())


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
