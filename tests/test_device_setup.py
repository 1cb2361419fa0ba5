"""One device setup for every command that computes: `posenc train`, `eval`, `probe` and `bench`
all go through hardware.setup_device (device, precision, autocast, TF32 on CUDA), so a run
evaluated again computes as its in-training evaluation did."""

from __future__ import annotations

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
    eval_run(tmp_path, ["eval.lengths=[1]"])
    probe_run(tmp_path, [], multiples=(1,), windows=1)
    bench([*TINY, "device=cpu", "bench.encodings=[rope]", "bench.reference=false", "bench.steps=1",
           "bench.rounds=1", "bench.warmup=0"])
    assert set_up == ["cpu"] * 4


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
