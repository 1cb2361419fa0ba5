"""Every config a user can pick composes (lightning-hydra-template's test_configs)."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from posenc.config import CONFIG_MODULE, apply_choice_schemas, group_options

GROUPS = ["encoding", "model", "recipe", "dataset", "tokenizer", "trainer", "logger"]


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_and_fits_the_schema(group):
    """Hydra merges each YAML onto the schema (a wrong type or unknown key fails here), and the
    encoding/dataset/tokenizer keys are arguments of the class their _target_ names."""
    for option in group_options(group):
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose("config", overrides=[f"{group}={option}"])
        apply_choice_schemas(cfg)
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # every key set, every interpolation resolves


def test_defaults_match_the_design():
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("config")
    assert cfg.encoding.name == "rope" and cfg.dataset.name == "pystdlib" and cfg.tokenizer.name == "byte"
    assert cfg.logger.mode == "offline" and cfg.device == "auto" and cfg.seed == 0
    assert list(cfg.eval.lengths) == [1, 2, 4, 8, 16]


def test_every_config_folder_ships_in_the_wheel():
    """conf/ is installed as the package posenc.conf: a folder missing from pyproject's
    packages would be left out of a non-editable install, and its configs with it."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[1]
    packages = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"posenc.conf" + "".join("." + part for part in p.relative_to(root / "conf").parts)
               for p in (root / "conf").rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert folders <= packages, sorted(folders - packages)
