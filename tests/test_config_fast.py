"""A config mistake is refused before torch loads: the schema of every choice is read from its
class's source (posenc/config/signatures.py), and `posenc train` imports torch only once its
config passed (posenc/cli/hydra_commands.py check_run)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from posenc.config.choices import _supported, choice_schema, imported_arguments
from posenc.config.signatures import Unreadable, read_signature

CONF = Path(__file__).resolve().parents[1] / "conf"


def shipped_targets() -> list[str]:
    """Every class a shipped YAML names with _target_ (encodings, datasets, tokenizers, the model)."""
    return sorted({m.group(1) for f in CONF.rglob("*.yaml") for m in re.finditer(r"_target_: ?([\w.]+)", f.read_text())})


@pytest.mark.parametrize("target", shipped_targets())
def test_the_source_gives_the_signature_the_imported_class_has(target):
    """What the schema is built from, read from the source, equals inspect.signature and
    typing.get_type_hints of the imported class, type for type as OmegaConf takes it."""
    signature = read_signature(target)  # Unreadable would fail the test: every shipped class is read from source
    from_source = None if signature.var_keyword else \
        [(p.name, _supported(p.annotation)) for p in signature.parameters if p.keyword and p.name != "self"]
    imported = imported_arguments(target)
    assert from_source == (None if imported is None else [(n, _supported(a)) for n, a in imported if n != "self"])


def test_what_the_source_cannot_settle_is_imported(tmp_path, monkeypatch):
    """A re-export, a base class's __init__, **kwargs and a dataclass are read from source; two base
    classes (the MRO decides) and a decorated class are imported instead, with the same schema."""
    package = tmp_path / "sigplug"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('importing the package is not needed')\n")
    (package / "base.py").write_text(textwrap.dedent("""
        from typing import Optional

        class Base:
            def __init__(self, d_model: int, name: str = "b", scale: Optional[float] = None) -> None:
                pass

        class Child(Base):
            pass

        class Loose:
            def __init__(self, **kwargs):
                pass
    """))
    (package / "more.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from functools import total_ordering
        from .base import Child as Again

        @dataclass
        class Task:
            task: str = "copy"
            multiples: list[float] | None = None

        class A:
            def __init__(self, a: int) -> None:
                pass

        class Both(A, Again):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    fields = lambda schema: [(f.name, f.type) for f in dataclasses.fields(schema) if not f.name.startswith("_")]  # noqa: E731
    assert fields(choice_schema("sigplug.base.Child")) == [("d_model", int), ("name", str), ("scale", float | None)]
    assert [p.name for p in read_signature("sigplug.more.Again").parameters] == ["self", "d_model", "name", "scale"]
    assert read_signature("sigplug.base.Loose").var_keyword and choice_schema("sigplug.base.Loose") is None
    assert fields(choice_schema("sigplug.more.Task")) == [("task", str), ("multiples", list[float] | None)]
    with pytest.raises(Unreadable):
        read_signature("sigplug.more.Both")
    (package / "__init__.py").write_text("")  # importable now: the fallback imports the class
    assert fields(choice_schema("sigplug.more.Both")) == [("a", int)]


# one interpreter: each command as a user types it, then what it imported (a fresh process, so
# nothing the test session loaded counts)
PROBE = r"""
import sys, time
from posenc.cli.app import app
codes, seconds = [], []
for argv in ARGVS:
    start = time.perf_counter()
    try:
        app(argv)
    except SystemExit as e:
        codes.append(e.code)
    seconds.append(time.perf_counter() - start)
print("CODES", codes)
print("SECONDS", seconds)
print("HEAVY", sorted(m for m in ("torch", "datasets", "wandb", "matplotlib", "posenc.train.loop") if m in sys.modules))
"""


def probe(argvs: list[list[str]], cwd: Path) -> str:
    """PROBE's output for these commands, run in a new interpreter in cwd."""
    done = subprocess.run([sys.executable, "-c", f"ARGVS = {argvs!r}\n{PROBE}"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def test_a_typo_or_a_wrong_type_is_refused_without_importing_torch(tmp_path):
    out = probe([["train", "trainer.max_step=10"], ["train", "trainer.max_steps=abc"], ["train", "encoding.bse=500"],
                 ["train", "model.d_model=100", "model.n_head=3"], ["--help"]], tmp_path)
    assert "CODES [1, 1, 1, 1, 0]" in out, out
    assert "HEAVY []" in out, out
    assert "did you mean trainer.max_steps" in out and "trainer.max_steps takes an int" in out
    assert "did you mean encoding.base" in out and "not divisible by model.n_head=3" in out
    assert not (tmp_path / "outputs").exists()  # a refused command writes nothing


def test_a_missing_data_file_is_refused_as_fast_before_any_run_dir(tmp_path):
    """A corpus file that is not there is a mistake like a typo: one line, no torch or datasets
    loaded, and no `run dir:` line for a directory that was never made."""
    (tmp_path / "corpus.txt").write_text("some text\n")
    (tmp_path / "other.csv").write_text("text\nmore\n")
    out = probe([["train", "dataset=hf", "dataset.data_files=[nope.jsonl]"],
                 ["train", "dataset=hf", "dataset.load_from_disk=not_a_folder"],
                 ["train", "dataset=hf", "dataset.data_files=[corpus.txt,other.csv]"],
                 ["train", "dataset=text", "dataset.files=[nope.txt]"]], tmp_path)
    assert "CODES [1, 1, 1, 1]" in out, out
    assert "HEAVY []" in out, out
    assert "dataset.data_files: 'nope.jsonl' does not exist" in out and "dataset.files: 'nope.txt' does not exist" in out
    assert "'not_a_folder' is not a folder `datasets` save_to_disk wrote" in out and "cannot read files with suffix" in out
    assert "run dir" not in out and not (tmp_path / "outputs").exists()
