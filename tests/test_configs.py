"""Every config a user can pick composes (lightning-hydra-template's test_configs)."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from posenc.config import CONFIG_MODULE, apply_choice_schemas, group_options
from posenc.record.rundir import load_run_config

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


def test_the_builder_passes_the_training_length_and_layer_count_under_one_name_each():
    """No encoding YAML repeats ${trainer.seq_len} or ${model.n_layer}: the builder hands
    train_len and n_layer to the encodings that take them, and a null size follows train_len."""
    from pathlib import Path

    from posenc import config as posenc_config
    from posenc.build import build_encoding
    from posenc.train.init_from import incompatible

    conf = Path(posenc_config.__file__).resolve().parents[2] / "conf" / "encoding"
    if not conf.is_dir():  # an installed wheel keeps conf inside the package
        conf = Path(posenc_config.__file__).resolve().parents[1] / "conf" / "encoding"
    for yaml in conf.glob("*.yaml"):
        assert "${trainer.seq_len}" not in yaml.read_text() and "${model.n_layer}" not in yaml.read_text(), yaml.name

    def built(*overrides: str):
        return build_encoding(posenc_config.compose(["model.n_layer=3", *overrides]))

    assert built("encoding=learned", "trainer.seq_len=48").max_len == 48
    assert built("encoding=learned", "trainer.seq_len=48", "encoding.max_len=100").max_len == 100
    assert built("encoding=cope", "trainer.seq_len=48").npos_max == 48
    assert built("encoding=cope", "trainer.seq_len=48").pos_emb.shape[0] == 3  # one table per layer
    assert built("encoding=rope", "trainer.seq_len=48").original_max_len == 48
    assert built("encoding=t5_bias", "trainer.seq_len=48").max_distance == 24  # half the training length
    assert built("encoding=fox", "trainer.seq_len=48").gate_weight.shape[0] == 3  # one gate projection per layer
    # a parent's learned table sized by its training length: init_from names what differs
    parent = posenc_config.compose(["encoding=learned", "trainer.seq_len=32"])
    child = posenc_config.compose(["encoding=learned", "trainer.seq_len=64"])
    (reason,) = incompatible(parent, child)
    assert "trainer.seq_len (parent 32, this run 64)" in reason and "encoding.max_len=32" in reason


def test_a_run_dir_from_before_an_eval_key_existed_reads_todays_default(tmp_path):
    """The evaluators read cfg.eval.<key> with no default of their own: a run made before
    eval.batch_tokens and eval.packing existed gets the YAML's values when it is loaded."""
    from posenc import config as posenc_config

    saved = OmegaConf.create(OmegaConf.to_container(posenc_config.compose(["eval.tokens=4096"])))
    del saved.eval["batch_tokens"], saved.eval["packing"]
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(saved, tmp_path / ".hydra" / "config.yaml")
    cfg = load_run_config(tmp_path, [])
    assert cfg.eval.tokens == 4096 and cfg.eval.batch_tokens == 16384 and cfg.eval.packing is None
