"""The path of one `posenc train` does each thing once: the config is composed once and
validated once, the encoding is built once for training (and once more at the end, by the rebuild
that proves the checkpoint: posenc/eval/proof.py), and a resume reads its checkpoint's tensors once
(the CLI reads the header). `posenc eval RUN_DIR` reads each file of the run once."""

from __future__ import annotations

import builtins
import io
from collections import Counter
from pathlib import Path

import pytest
from conftest import TINY, cli_env, run_dirs
from typer.testing import CliRunner

from posenc.cli.app import app


def _counting(monkeypatch: pytest.MonkeyPatch, counts: Counter, name: str, owner, attr: str) -> None:
    original = getattr(owner, attr)

    def counted(*args, **kwargs):
        counts[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attr, counted)


def _config_loader_class() -> type:
    """The class of Hydra's ConfigLoader, whose load_configuration is one compose (reached through
    Hydra's public compose API, as posenc reaches it)."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from posenc.config.load import version_base

    with initialize_config_module("posenc.conf", **version_base()):
        return type(GlobalHydra.instance().config_loader())


def _train(args: list[str], monkeypatch: pytest.MonkeyPatch) -> Counter:
    import posenc.build
    import posenc.config
    import posenc.eval.proof
    import posenc.record.statefile
    import posenc.train.loop

    for key, value in cli_env().items():
        monkeypatch.setenv(key, value)
    counts: Counter = Counter()
    _counting(monkeypatch, counts, "compose", _config_loader_class(), "load_configuration")
    _counting(monkeypatch, counts, "validate", posenc.config, "validate")
    _counting(monkeypatch, counts, "validate", posenc.train.loop, "validate_config")
    _counting(monkeypatch, counts, "tensor reads", posenc.record.statefile, "read_tensors")
    _counting(monkeypatch, counts, "encoding builds", posenc.build, "build_encoding")
    _counting(monkeypatch, counts, "proof rebuilds", posenc.eval.proof, "rebuild")
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, (result.stdout + result.stderr)[-2000:]
    return counts


def test_a_run_is_composed_and_validated_once(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _train([*TINY, "trainer.max_steps=2", "eval.at_end=false"], monkeypatch)
    assert counts["compose"] == 1
    assert counts["validate"] == 1
    assert counts["encoding builds"] == 2 and counts["proof rebuilds"] == 1  # training's, and the proof's at its end


def test_a_resume_reads_the_checkpoints_tensors_once(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _train([*TINY, "trainer.max_steps=2", "eval.at_end=false"], monkeypatch)
    [run_dir] = run_dirs(workdir)
    counts = _train([f"trainer.resume={run_dir}", "trainer.max_steps=4"], monkeypatch)
    assert counts["tensor reads"] == 1
    assert counts["compose"] == 1 and counts["validate"] == 1
    assert counts["encoding builds"] == 2 and counts["proof rebuilds"] == 1
    assert run_dirs(workdir) == [run_dir]


def test_eval_reads_each_file_of_the_run_once(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One RunDir serves the whole command: .hydra/config.yaml is read once (the checkpoint to load
    and the typed config both ask for it), and so is every other file of the run; the checkpoint's
    header and tensors once each."""
    import posenc.record.statefile

    _train([*TINY, "trainer.max_steps=2"], monkeypatch)
    [run_dir] = run_dirs(workdir)
    reads: Counter = Counter()
    original = io.open

    def counted_open(file, mode="r", *args, **kwargs):
        path = Path(file).resolve() if isinstance(file, (str, Path)) else None
        if path is not None and path.is_relative_to(run_dir.resolve()) and not set(mode) & set("wax+"):
            reads[str(path.relative_to(run_dir.resolve()))] += 1
        return original(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", counted_open)  # pathlib's open, OmegaConf.load
    monkeypatch.setattr(builtins, "open", counted_open)  # open() itself
    counts: Counter = Counter()
    _counting(monkeypatch, counts, "checkpoint headers", posenc.record.statefile, "safe_open")
    _counting(monkeypatch, counts, "checkpoint tensors", posenc.record.statefile, "read_tensors")
    result = CliRunner().invoke(app, ["eval", str(run_dir), "eval.lengths=[1]"])
    assert result.exit_code == 0, (result.stdout + result.stderr)[-2000:]
    assert reads[".hydra/config.yaml"] == 1
    assert set(reads.values()) == {1}, reads  # provenance.json and anything else: once
    assert counts == {"checkpoint headers": 1, "checkpoint tensors": 1}
