"""trainer.init_from=<run dir>: a new run starts from a finished run's weights and nothing else
(the context-extension recipe of Position Interpolation and YaRN: train at T, rescale RoPE,
fine-tune briefly at s·T). Its first training loss is the trained parent's on that batch, its
optimiser, step and warmup start afresh, its dir records the parent, scaling extends from the
parent's training length, and a run whose weights would not be the parent's is refused with
one error line, writing nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY, run_cli, run_dirs

from posenc.build import build_data, build_model
from posenc.data.windows import RandomWindows
from posenc.record.directory import read_jsonl
from posenc.record.rundir import load_checkpoint, load_run_config

PARENT_STEPS = 40


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TINY RoPE run trained PARENT_STEPS steps at seq_len 32."""
    cwd = tmp_path_factory.mktemp("parent")
    result = run_cli("train", *TINY, f"trainer.max_steps={PARENT_STEPS}", "trainer.checkpoint_interval=100", cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(cwd)
    return run_dir


def first_batch_loss(run_dir: Path, weights: dict) -> float:
    """The loss of `weights` on the first training batch run_dir's config draws."""
    cfg = load_run_config(run_dir, [])
    data = build_data(cfg)
    model = build_model(cfg, data.vocab_size)
    model.load_state_dict(weights)
    batch = RandomWindows(data.train, cfg.trainer.seq_len, cfg.trainer.batch_size, seed=cfg.seed).next()
    x, y = batch.x, batch.y
    with torch.no_grad():
        return float(model(x, y)[1])


def test_a_finetune_continues_from_the_parents_weights_with_a_fresh_optimiser(parent: Path, tmp_path: Path) -> None:
    result = run_cli("train", *TINY, "trainer.seq_len=64", "trainer.max_steps=3", "trainer.warmup_steps=2",
                     "seed=1", f"trainer.init_from={parent}", "encoding.scaling=linear",
                     "encoding.scaling_factor=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [child] = run_dirs(tmp_path)
    rows = read_jsonl(child / "metrics.jsonl")
    parent_rows = read_jsonl(parent / "metrics.jsonl")

    # the first step's loss is the trained parent's on that batch (with the child's scaling)...
    expected = first_batch_loss(child, load_checkpoint(parent)["model"])
    assert rows[0]["train/loss"] == pytest.approx(expected, abs=1e-5)
    # ...well below a fresh model's (~ln 256 for bytes)
    assert parent_rows[0]["train/loss"] > math.log(256) - 0.3
    assert rows[0]["train/loss"] < parent_rows[0]["train/loss"] - 0.3
    # step and tokens start at 0, and the lr warmup restarts: step 1 uses lr/warmup_steps
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["tokens"] == 4 * 64
    assert rows[0]["train/lr"] == pytest.approx(2e-3 / 2)
    state = load_checkpoint(child)
    assert state["step"] == 3 and state["tokens"] == 3 * 4 * 64

    # the child's dir names its parent and holds the parent's config; its summary says so
    summary = json.loads((child / "summary.json").read_text())
    assert summary["parent"]["path"] == str(parent.resolve())
    assert summary["parent"]["step"] == PARENT_STEPS and summary["parent"]["seq_len"] == 32
    recorded = json.loads((child / "parent.json").read_text())
    assert recorded["path"] == str(parent.resolve())
    assert recorded["config"] == load_checkpoint(parent)["config"]
    # scaling extends from the parent's training length (32), not the child's seq_len (64)
    assert load_run_config(child, []).encoding.original_max_len == 32
    assert "encoding.original_max_len=32" in yaml.safe_load((child / ".hydra" / "overrides.yaml").read_text())


def test_an_explicit_original_max_len_is_kept(parent: Path, tmp_path: Path) -> None:
    result = run_cli("train", *TINY, "trainer.seq_len=64", "trainer.max_steps=1", f"trainer.init_from={parent}",
                     "encoding.scaling=ntk", "encoding.scaling_factor=2", "encoding.original_max_len=48", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [child] = run_dirs(tmp_path)
    assert load_run_config(child, []).encoding.original_max_len == 48


@pytest.mark.parametrize("override, key", [("model.d_model=64", "model.d_model"),
                                           ("tokenizer=bpe", "tokenizer._target_"),
                                           ("encoding=alibi", "encoding._target_")])
def test_a_run_whose_weights_would_not_fit_is_refused_writing_nothing(parent: Path, tmp_path: Path,
                                                                       override: str, key: str) -> None:
    result = run_cli("train", *TINY, f"trainer.init_from={parent}", override, cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and key in lines[0], result.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()


def test_a_missing_parent_is_refused_writing_nothing(tmp_path: Path) -> None:
    result = run_cli("train", *TINY, f"trainer.init_from={tmp_path / 'nope'}", cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error:") and "init_from" in lines[0]
    assert not (tmp_path / "outputs").exists()


def test_a_sweep_over_scaling_with_zero_steps_evaluates_the_parent_as_is(parent: Path, tmp_path: Path) -> None:
    """max_steps=0 with init_from: the parent's weights, evaluated (and checkpointed) under each
    scaling: with scaling=none at the parent's own seq_len that is exactly the parent's val loss."""
    result = run_cli("train", "-m", *TINY, "trainer.max_steps=0", f"trainer.init_from={parent}",
                     "encoding.scaling=none,linear", "encoding.scaling_factor=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = {load_run_config(d, []).encoding.scaling: d for d in run_dirs(tmp_path)}
    assert set(jobs) == {"none", "linear"}
    parent_val = json.loads((parent / "summary.json").read_text())["val/loss"]
    summaries = {m: json.loads((d / "summary.json").read_text()) for m, d in jobs.items()}
    assert summaries["none"]["steps"] == 0 and summaries["none"]["parent"]["step"] == PARENT_STEPS
    assert summaries["none"]["val/loss"] == pytest.approx(parent_val, abs=1e-5)
    assert summaries["linear"]["val/loss"] != pytest.approx(parent_val, abs=1e-3)  # PI changed the positions
    assert all(load_checkpoint(d)["step"] == 0 for d in jobs.values())  # `posenc eval` works on each


def test_a_sweep_over_parents_trained_at_one_length_extends_from_it(parent: Path) -> None:
    from posenc.train.init_from import parent_overrides

    overrides = [f"trainer.init_from={parent},{parent}", "trainer.seq_len=128"]
    assert parent_overrides(overrides) == [*overrides, "encoding.original_max_len=32"]
    explicit = [f"trainer.init_from={parent}", "encoding.original_max_len=48"]
    assert parent_overrides(explicit) == explicit


def test_naming_the_parents_encoding_still_extends_from_the_parents_length(parent: Path, tmp_path: Path) -> None:
    """`encoding=rope` with a RoPE parent is the parent's encoding: the command the issue tried
    (it was refused, asking for original_max_len) runs and extends from T = 32; another encoding
    is left to the refusal that names encoding._target_."""
    from posenc.train.init_from import parent_overrides

    named = [f"trainer.init_from={parent}", "encoding=rope", "trainer.seq_len=128"]
    assert parent_overrides(named) == [*named, "encoding.original_max_len=32"]
    other = [f"trainer.init_from={parent}", "encoding=alibi"]
    assert parent_overrides(other) == other
    result = run_cli("train", *TINY, "encoding=rope", f"trainer.init_from={parent}", "trainer.seq_len=128",
                     "trainer.max_steps=0", "encoding.scaling=yarn", "encoding.scaling_factor=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [child] = run_dirs(tmp_path)
    assert load_run_config(child, []).encoding.original_max_len == 32


def test_init_from_set_where_the_cli_cannot_see_it_must_name_the_training_length(parent: Path) -> None:
    """A config (not the command line) that sets init_from leaves original_max_len at the new
    run's seq_len: refused, saying which length to give, rather than extending from the wrong T."""
    from posenc.config import compose
    from posenc.errors import UserError
    from posenc.train.init_from import check

    tiny = [o for o in TINY if not o.startswith("trainer.seq_len")]
    cfg = compose([*tiny, "trainer.seq_len=128", f"trainer.init_from={parent}"], bench=False)
    with pytest.raises(UserError, match=r"encoding.original_max_len=32"):
        check(cfg)
    cfg = compose([*tiny, "trainer.seq_len=128", f"trainer.init_from={parent}", "encoding.original_max_len=32"],
                  bench=False)
    assert check(cfg) == parent.resolve()


def test_an_init_from_run_reads_its_parent_once_and_builds_its_encoding_at_most_once(
        parent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's overrides, its pre-check and the job's check all ask for the parent: in one
    `posenc train` process its config is read once and its encoding built at most once (to
    compare parameter shapes); the child's shapes come from the encoding training builds anyway."""
    import shutil

    from conftest import cli_env
    from typer.testing import CliRunner

    import posenc.build
    from posenc.cli.app import app
    from posenc.train import init_from

    fresh = tmp_path / "parent"  # a path this process has never read (the module's parent may have been)
    shutil.copytree(parent, fresh)
    reads, parent_configs, parent_builds, builds = [], [], [], []
    read, build = init_from.load_run_config, posenc.build.build_encoding

    def counted_read(run_dir, overrides):
        reads.append(Path(run_dir))
        parent_configs.append(read(run_dir, overrides))
        return parent_configs[-1]

    def counted_build(cfg):
        builds.append(cfg)
        parent_builds.extend([cfg] if any(cfg is p for p in parent_configs) else [])
        return build(cfg)

    monkeypatch.setattr(init_from, "load_run_config", counted_read)
    monkeypatch.setattr(posenc.build, "build_encoding", counted_build)
    for key, value in cli_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    # check=false: measuring `posenc check`'s verdict on this RoPE (its scaling has no shipped verdict) builds
    # the models the check builds, in this process (tests/test_verdicts.py)
    result = CliRunner().invoke(app, ["train", *TINY, "trainer.seq_len=64", "trainer.max_steps=1",
                                      f"trainer.init_from={fresh}", "encoding.scaling=linear", "check=false"])
    assert result.exit_code == 0, (result.stdout + result.stderr)[-2000:]
    assert reads == [fresh.resolve()]
    assert len(parent_builds) <= 1
    # the child's encoding: once by the CLI's pre-check (a misfit refused before any job starts),
    # once in the model training builds; no other build of either
    assert len(builds) - len(parent_builds) <= 2
    [child] = run_dirs(tmp_path)
    assert json.loads((child / "parent.json").read_text())["path"] == str(fresh.resolve())
