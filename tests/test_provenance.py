"""What a run records of the code it ran (posenc/record/provenance.py, code.py) and of its encoding's
options: posenc's own modules a plug-in's class imports are covered as the plug-in's own are, a change
is named by the definition it changed, and a comment, a docstring or a reflowed line is no change.

posenc's source is copied into a folder of the test's own and provenance pointed at it
(``posenc_root``), so the test edits posenc's rope.py without touching the package under test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from posenc.record import provenance

PLUGIN = '''\
"""A plug-in's RoPE with a learned scale on q·k (a researcher's subclass of posenc's RoPE)."""
import torch
from torch import nn

from posenc.nn.encodings.rope import RoPE


class ScaledRoPE(RoPE):
    def __init__(self, d_model: int, n_head: int, name: str = "scaled_rope", alpha_init: float = 1.0,
                 mode: str = "per_head", **kwargs) -> None:
        super().__init__(d_model, n_head, name, **kwargs)
        self.alpha = nn.Parameter(torch.full((n_head if mode == "per_head" else 1, 1, 1), alpha_init))

    def transform_qk(self, q, k, ctx, layer=0):
        q, k = super().transform_qk(q, k, ctx, layer)
        return q * self.alpha, k
'''
ROTATION = "return rotate_complex(q, freqs), rotate_complex(k, freqs)"


@pytest.fixture
def plugin_and_posenc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(a run dir whose provenance.json records the plug-in's class, posenc's copied source tree)."""
    source = tmp_path / "posenc_copy"
    shutil.copytree(Path(provenance.__file__).resolve().parents[1], source / "posenc",
                    ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.yaml", "*.md"))
    monkeypatch.setattr(provenance, "posenc_root", lambda: source)
    (tmp_path / "plug" / "myrope").mkdir(parents=True)
    (tmp_path / "plug" / "myrope" / "__init__.py").write_text("")
    (tmp_path / "plug" / "myrope" / "encodings.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "plug"))
    run = tmp_path / "run"
    run.mkdir()
    provenance.write(run, OmegaConf.create({"encoding": {"_target_": "myrope.encodings.ScaledRoPE"}}))
    return run, source / "posenc" / "nn" / "encodings" / "rope.py"


def test_a_plugin_subclassing_rope_covers_posencs_modules_and_names_a_changed_method(plugin_and_posenc):
    """A one-line change in posenc's rope.py is reported for a run of a plug-in that subclasses RoPE,
    naming the method; a comment, a docstring and blank lines changed in the same file are not."""
    run, rope = plugin_and_posenc
    record = provenance.RunDir(run).provenance()["code"]["myrope.encodings.ScaledRoPE"]
    assert {"myrope/encodings.py", "posenc/nn/encodings/rope.py", "posenc/nn/encodings/base.py"} <= set(record["sources"])
    assert "myrope/__init__.py" not in record["sources"]  # empty: runs nothing
    assert "ScaledRoPE.transform_qk" in record["definitions"]["myrope/encodings.py"]
    original = rope.read_text()
    assert original.count(ROTATION) == 1
    rope.write_text(original.replace('"""Rotary position embedding', '# a comment\n\n"""Rotary position embedding, reworded')
                    .replace(ROTATION, ROTATION + "  # the eager path\n\n"))
    assert provenance.changes(run) == []
    rope.write_text(original.replace(ROTATION, "return rotate_complex(q, freqs), rotate_complex(k, -freqs)"))
    assert provenance.changes(run) == ["myrope.encodings.ScaledRoPE (posenc/nn/encodings/rope.py: "
                                       "RoPE.transform_qk changed)"]


def test_a_definition_added_or_removed_is_named_and_a_new_imported_file_counted(plugin_and_posenc):
    run, rope = plugin_and_posenc
    plugin = Path(provenance.locate("myrope.encodings.ScaledRoPE")[1])
    text = plugin.read_text()
    plugin.write_text(text.replace("from posenc.nn.encodings.rope import RoPE",
                                   "from posenc.nn.encodings.rope import RoPE\nfrom myrope.helpers import unit")
                      + "\n\ndef extra():\n    return unit\n")
    (plugin.parent / "helpers.py").write_text("unit = 1.0\n")
    [line] = provenance.changes(run)
    assert "myrope/encodings.py: imports changed, extra (new)" in line and "myrope/helpers.py (new)" in line


def test_a_record_of_file_bytes_is_still_compared_as_it_was_taken(plugin_and_posenc, tmp_path):
    """Runs made before code hashing recorded each file's SHA-256 of its bytes: a comment counts there."""
    import hashlib
    import json

    run, _ = plugin_and_posenc
    plugin = Path(provenance.locate("myrope.encodings.ScaledRoPE")[1])
    old = {"code": {"myrope.encodings.ScaledRoPE": {
        "module": "myrope.encodings", "file": str(plugin), "import_root": str(plugin.parents[1]),
        "sources": {"myrope/encodings.py": hashlib.sha256(plugin.read_bytes()).hexdigest()}, "sha256": "x"}}}
    (run / "provenance.json").write_text(json.dumps(old))
    assert provenance.changes(run) == []
    plugin.write_text(plugin.read_text() + "# a comment\n")
    assert provenance.changes(provenance.RunDir(run)) == ["myrope.encodings.ScaledRoPE (myrope/encodings.py changed)"]


def test_a_subclass_records_its_own_arguments_with_its_bases_options(plugin_and_posenc):
    """RoPE writes its own options() (its scaling's keys only when it scales); a subclass's own
    constructor arguments are recorded beside them, as summary.json and compare show them."""
    from posenc.build import encoding_summary
    from myrope.encodings import ScaledRoPE

    summary = encoding_summary(ScaledRoPE(32, 4, alpha_init=0.5, mode="shared", base=500.0))
    assert summary == {"name": "scaled_rope", "base": 500.0, "fraction": 1.0, "style": "interleaved",
                       "alpha_init": 0.5, "mode": "shared"}
