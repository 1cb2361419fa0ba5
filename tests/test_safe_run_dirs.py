"""Run directories are shared between researchers: opening one must never run code from it.

A checkpoint is tensors (safetensors) and JSON; a pickle, which runs whatever its file names when
loaded, is never unpickled by eval, probe, resume or init_from. An old run dir (pickled
checkpoints/*.pt) is refused with one line naming `posenc convert`, which reads only tensors and
RNG state, never code."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, run_cli, run_dirs

from posenc.build import build_model
from posenc.cli.launch import prepare
from posenc.config import compose
from posenc.errors import UserError
from posenc.eval.run import load_trained
from posenc.record.convert import convert
from posenc.record.rundir import RunDir, load_checkpoint
from posenc.train import init_from


class Payload:
    """Unpickling this calls exec(), which creates the marker file: what a hostile checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("finished")
    result = run_cli("train", *TINY, cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(cwd)
    return run_dir


@pytest.fixture
def hostile(finished_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(a copy of a finished run whose checkpoint is a code-running pickle, the marker it would create)."""
    run_dir = tmp_path / "shared_run"
    shutil.copytree(finished_run, run_dir)
    marker = tmp_path / "code_ran"
    state = load_checkpoint(run_dir)
    RunDir(run_dir).checkpoint().unlink()
    torch.save({**state, "version": 1, "model": Payload(marker)}, run_dir / "checkpoints" / "last.pt")
    return run_dir, marker


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr[-2000:]
    return lines[0]


def test_every_command_that_opens_a_run_dir_refuses_a_pickled_checkpoint_and_runs_nothing(hostile, tmp_path):
    run_dir, marker = hostile
    commands = {"eval": ["eval", str(run_dir)], "probe": ["probe", str(run_dir)],
                "resume": ["train", f"trainer.resume={run_dir}", "trainer.max_steps=8"],
                "init_from": ["train", *TINY, f"trainer.init_from={run_dir}", "trainer.seq_len=64",
                              "encoding.scaling=yarn", "encoding.scaling_factor=2"]}
    for name, args in commands.items():
        line = one_error_line(run_cli(*args, cwd=tmp_path))
        assert "old pickle format" in line and f"posenc convert {run_dir}" in line, name
        assert not marker.exists(), f"{name} ran the checkpoint's code"
    assert not (tmp_path / "outputs").exists()  # init_from refused before Hydra made a run dir

    # convert reads tensors and RNG state only: it refuses the file, naming what it would have called
    line = one_error_line(run_cli("convert", str(run_dir), cwd=tmp_path))
    assert "builtins.exec" in line and "nothing in it ran" in line
    assert not marker.exists() and not RunDir(run_dir).checkpoint().exists()  # nothing ran, nothing written


def test_a_pickle_named_like_a_checkpoint_is_not_unpickled(hostile, tmp_path):
    """The same pickle under the new name: the safetensors reader finds no header and stops."""
    run_dir, marker = hostile
    (run_dir / "checkpoints" / "last.pt").rename(RunDir(run_dir).checkpoint())
    cfg = compose([*TINY, f"trainer.init_from={run_dir}"])
    opens = {"eval and probe": lambda: load_trained(run_dir, []),
             "resume": lambda: prepare([f"trainer.resume={run_dir}", "trainer.max_steps=8"], cwd=tmp_path),
             "init_from": lambda: init_from.start_from_parent(cfg, build_model(cfg, 256), tmp_path, write=False)}
    for name, open_run in opens.items():
        with pytest.raises(UserError, match="is not a posenc checkpoint, or is corrupt"):
            open_run()
        assert not marker.exists(), f"{name} ran the checkpoint's code"


def test_convert_turns_an_old_run_dir_into_one_every_command_reads(finished_run, tmp_path):
    """A format-1 checkpoint (torch.save of the same state, numpy RNG state included) converts
    reading only tensors and RNG state, to the same weights, optimiser state and RNG state, and `posenc eval` reads it."""
    run_dir = tmp_path / "old_run"
    shutil.copytree(finished_run, run_dir)
    state = load_checkpoint(run_dir)
    RunDir(run_dir).checkpoint().unlink()
    torch.save({**state, "version": 1}, run_dir / "checkpoints" / "last.pt")
    with pytest.raises(UserError, match="old pickle format"):
        load_checkpoint(run_dir)

    assert convert(run_dir) == [RunDir(run_dir).checkpoint()]
    converted = load_checkpoint(run_dir)
    for key in ("step", "tokens", "config", "val", "sampler"):
        assert str(converted[key]) == str(state[key]), key
    assert all(torch.equal(converted["model"][k], v) for k, v in state["model"].items())
    assert converted["rng"]["python"] == state["rng"]["python"]
    assert all((a == b).all() if hasattr(a, "shape") else a == b
               for a, b in zip(converted["rng"]["numpy"], state["rng"]["numpy"]))
    assert str(converted["optimizer"]) == str(state["optimizer"])
    result = run_cli("eval", str(run_dir), "eval.lengths=[1]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_state_comes_back_as_saved_with_tied_weights_stored_once(tmp_path):
    """What a checkpoint holds round-trips: tensors bit for bit (a tied weight once, tied again on
    load), tuples as tuples (Python's RNG state), integer dict keys (the optimiser's), numpy's RNG
    array; an object JSON and tensors cannot hold is refused when saving, not pickled."""
    import random

    import numpy as np

    from posenc.record.statefile import load_state, save_state

    embedding = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = embedding.weight
    optimizer = torch.optim.AdamW([embedding.weight], betas=(0.9, 0.95))
    head(embedding(torch.tensor([1, 2]))).sum().backward()
    optimizer.step()
    state = {"model": {"wte.weight": embedding.weight, "lm_head.weight": head.weight},
             "optimizer": optimizer.state_dict(), "python": random.getstate(), "numpy": np.random.get_state(),
             "best": float("inf"), "config": {"encoding": {"name": "rope", "short_factor": None}}}
    save_state(state, tmp_path / "s.safetensors")
    back = load_state(tmp_path / "s.safetensors")
    assert torch.equal(back["model"]["wte.weight"], embedding.weight.detach())
    assert back["model"]["lm_head.weight"] is back["model"]["wte.weight"]
    assert back["python"] == state["python"] and back["best"] == float("inf") and back["config"] == state["config"]
    assert back["numpy"][0] == "MT19937" and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert list(back["optimizer"]["state"]) == [0] and back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    torch.testing.assert_close(back["optimizer"]["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(TypeError, match="cannot be stored without pickle"):
        save_state({"sampler": Payload(tmp_path / "never")}, tmp_path / "refused.safetensors")
    assert not (tmp_path / "refused.safetensors").exists()


def test_a_checkpoint_is_as_readable_as_the_run_files_beside_it(finished_run: Path, tmp_path: Path) -> None:
    """Whoever may read a shared run dir may read its checkpoint: the mode a new file gets under the
    umask (0644 under 0022, 0640 under 0027), as summary.json has, not 0600."""
    from posenc.record.statefile import save_state

    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    assert mode(RunDir(finished_run).checkpoint()) == mode(finished_run / "summary.json")
    for umask, expected in ((0o022, 0o644), (0o027, 0o640)):
        previous = os.umask(umask)
        try:
            save_state({"w": torch.zeros(2)}, tmp_path / f"state_{umask:o}.safetensors")
        finally:
            os.umask(previous)
        assert mode(tmp_path / f"state_{umask:o}.safetensors") == expected
