"""The suite's YAML memo (tests/yaml_memo.py) loads exactly what OmegaConf's own load does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
import yaml_memo
from omegaconf import OmegaConf


def test_the_memo_gives_what_the_original_gives_as_a_config_of_its_own(tmp_path: Path):
    assert OmegaConf.load is not yaml_memo._original  # conftest installed it
    path = tmp_path / "c.yaml"
    path.write_text("# @package _global_\na: {b: [1, 2.5e-3, null]}\nname: x\n")
    first, second = OmegaConf.load(path), OmegaConf.load(path)
    assert first == second == yaml_memo._original(path)
    first.a.b.append(3)  # one config's change is not the next load's
    assert OmegaConf.load(path).a.b == [1, 2.5e-3, None]
    path.write_text("a: 2\n")  # an edited file is a new text
    assert OmegaConf.load(path) == OmegaConf.create({"a": 2})
    with path.open(encoding="utf-8") as f:  # a stream, as Hydra's config sources pass it
        f.read(5)
        f.seek(0)
        assert OmegaConf.load(f) == OmegaConf.create({"a": 2})


def test_yaml_that_does_not_parse_fails_as_it_does_without_the_memo(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(yaml.YAMLError, match="bad.yaml"):
        OmegaConf.load(path)
