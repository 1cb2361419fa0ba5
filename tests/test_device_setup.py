"""One device setup for every command that computes: `posenc train`, `eval`, `probe` and `bench`
all go through hardware.setup_device (device, precision, autocast, TF32 on CUDA), so a run
evaluated again computes as its in-training evaluation did."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY
from posenc import hardware
from posenc.bench.run import bench
from posenc.config import compose
from posenc.eval.probe_run import probe_run
from posenc.eval.run import eval_run
from posenc.train.loop import train


def test_train_eval_probe_and_bench_each_set_up_the_device_as_training_does(tmp_path: Path, monkeypatch):
    set_up: list[str] = []
    real = hardware.enable_fast_matmul
    monkeypatch.setattr(hardware, "enable_fast_matmul", lambda device: (set_up.append(str(device)), real(device)))
    cfg = compose([*TINY, "device=cpu"], bench=False)
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")  # what Hydra writes into a run dir
    train(cfg, tmp_path)
    assert set_up == ["cpu"]
    record, _ = eval_run(tmp_path, ["eval.lengths=[1]"])
    assert record["precision"] == "fp32"  # auto on a CPU, recorded beside the numbers it computed
    probe_run(tmp_path, [], multiples=(1,), windows=1)
    bench([*TINY, "device=cpu", "bench.encodings=[rope]", "bench.reference=false", "bench.steps=1",
           "bench.rounds=1", "bench.warmup=0"])
    assert set_up == ["cpu"] * 4


def test_eval_records_the_precision_it_computed_in(tmp_path: Path):
    cfg = compose([*TINY, "device=cpu"], bench=False)
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    train(cfg, tmp_path)
    record, path = eval_run(tmp_path, ["eval.lengths=[1]", "trainer.precision=bf16"])
    assert record["precision"] == "bf16" and json.loads(path.read_text())["precision"] == "bf16"


def test_precision_auto_is_fp32_on_the_cpu_with_no_autocast():
    setup = hardware.setup_device("cpu", "auto")
    assert setup.device == torch.device("cpu") and setup.precision == "fp32"
    with setup.autocast():
        assert torch.ones(2, 2) @ torch.ones(2, 2) is not None and not torch.is_autocast_enabled()


def test_cuda_asked_for_without_cuda_is_a_user_error(monkeypatch):
    from posenc.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="CUDA is not available here"):
        hardware.setup_device("cuda", "auto")


@pytest.fixture
def torch_threads():
    """The test process's torch thread count, restored after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("load, threads", [(0.2, 2), (1.4, 1), (7.5, 1)])
def test_a_cpu_run_on_a_loaded_machine_trains_on_the_cores_left_free(monkeypatch, torch_threads, load, threads):
    """Without OMP_NUM_THREADS, a CPU run takes the cores the load average leaves free (at least
    one, at most torch's default), so it does not spin on busy cores; said when it lowers them."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(hardware, "cpu_count", lambda: 2)
    monkeypatch.setattr(hardware.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(hardware, "busy_cpus", lambda: load)  # busy now as on average
    monkeypatch.setattr(hardware, "_CHOSEN", None)  # a process's first run
    torch.set_num_threads(2)
    assert hardware.choose_cpu_threads(torch.device("cpu")) == threads == torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's (or torchrun's) choice stands
    torch.set_num_threads(2)
    assert hardware.choose_cpu_threads(torch.device("cpu")) == 2


def test_a_sweeps_jobs_in_one_process_train_on_the_first_jobs_thread_count(monkeypatch, torch_threads):
    """The basic launcher runs a sweep's jobs one after another in one process: the load the earlier
    jobs made (this process's own) must not give the later ones fewer threads (other last bits, another
    speed) than the first had."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(hardware, "cpu_count", lambda: 2)
    monkeypatch.setattr(hardware, "_CHOSEN", None)
    torch.set_num_threads(2)
    for load in (0.1, 2.0, 0.1):  # quiet, then the first job's own load, then quiet again
        monkeypatch.setattr(hardware.os, "getloadavg", lambda load=load: (load, load, load))
        monkeypatch.setattr(hardware, "busy_cpus", lambda load=load: load)
        assert hardware.choose_cpu_threads(torch.device("cpu")) == 2 == torch.get_num_threads()


@pytest.mark.parametrize("load, now, threads", [(1.4, 0.1, 2), (0.9, 0.0, 2), (0.2, 1.9, 2), (1.9, 1.8, 1),
                                                (1.9, None, 1)])
def test_the_cpus_count_as_busy_only_when_busy_on_average_and_now(monkeypatch, torch_threads, load, now, threads):
    """The 1-minute load average lags: a job that ended a minute ago (the suite, pip's install) or this
    process's own start-up left it at 0.9 on 2 idle CPUs, and the default model trained on 1 thread at
    3,100 tokens/s instead of 8,300. A moment's sample alone would miss work that runs in bursts."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(hardware, "cpu_count", lambda: 2)
    monkeypatch.setattr(hardware.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(hardware, "busy_cpus", lambda: now)  # None: no /proc/stat (macOS)
    monkeypatch.setattr(hardware, "_CHOSEN", None)
    torch.set_num_threads(2)
    assert hardware.choose_cpu_threads(torch.device("cpu")) == threads


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux's /proc/stat")
def test_a_process_spinning_on_a_cpu_is_seen_busy_now():
    """busy_cpus reads /proc/stat: a child spinning on this process's CPUs keeps at least most of one busy."""
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        busy = hardware.busy_cpus()
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.7 <= busy <= hardware.cpu_count() + 0.05


def test_a_resumed_cpu_run_keeps_the_threads_it_started_with(monkeypatch, torch_threads, tmp_path: Path):
    """The sums of a CPU step change in their last bits with the thread count: the checkpoint and
    summary record it, and a resume computes on it, whatever the load or torch's count are now."""
    import conftest
    from posenc.record.rundir import RunDir

    torch.set_num_threads(1)
    assert conftest.run_cli("train", *TINY, cwd=tmp_path).returncode == 0  # in this process: its 1 thread
    [run_dir] = conftest.run_dirs(tmp_path)
    assert RunDir(run_dir).load_checkpoint("last", tensors=False)["threads"] == 1
    torch.set_num_threads(2)
    env = conftest.cli_env
    monkeypatch.setattr(conftest, "cli_env", lambda: {k: v for k, v in env().items() if k != "OMP_NUM_THREADS"})
    resumed = conftest.run_cli("train", f"trainer.resume={run_dir}", "trainer.max_steps=6", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["machine/threads"] == torch.get_num_threads() == 1
