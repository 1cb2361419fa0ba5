"""posenc's configuration, one job per module:

- ``schema``: the typed schema (dataclasses in Hydra's ConfigStore);
- ``choices``: the encoding, dataset and tokenizer nodes typed by their class's ``__init__``;
- ``overrides``: one override parser (Hydra's);
- ``searchpath``: where configs come from (posenc's conf/, then plugins' directories);
- ``catalogue``: the encodings on offer and their options;
- ``load``: ``compose`` outside a run, ``typed_run_config`` of a run directory's saved config;
- ``rules``: what types cannot say (ranges, d_model % n_head), ``validate``.

Every public name is importable from ``posenc.config`` itself, as before it was a package.
"""

from posenc.config.catalogue import encoding_catalogue, encoding_options, encoding_yaml
from posenc.config.choices import CHOICE_GROUPS, apply_choice_schemas, choice_schema
from posenc.config.load import MOVED_MODULES, compose, typed_run_config
from posenc.config.overrides import ParsedOverride, parse_overrides
from posenc.config.rules import RULES, Rule, head_split_fix, validate
from posenc.config.schema import (
    SCHEMA_NAME,
    BenchConfig,
    BudgetConfig,
    EvalConfig,
    LayerKindConfig,
    LayoutConfig,
    LoggerConfig,
    ModelConfig,
    PosencConfig,
    TrainerConfig,
    steps_times,
)
from posenc.config.searchpath import (
    CONFIG_MODULE,
    CONFIG_PATH,
    config_file,
    group_options,
    with_plugin_sources,
)

__all__ = [
    "CHOICE_GROUPS", "CONFIG_MODULE", "CONFIG_PATH", "MOVED_MODULES", "RULES", "SCHEMA_NAME", "BenchConfig",
    "BudgetConfig", "EvalConfig", "LayerKindConfig", "LayoutConfig", "LoggerConfig", "ModelConfig",
    "ParsedOverride", "PosencConfig", "Rule", "TrainerConfig", "apply_choice_schemas", "choice_schema",
    "compose", "config_file", "encoding_catalogue", "encoding_options", "encoding_yaml",
    "group_options", "head_split_fix", "typed_run_config", "parse_overrides", "steps_times", "validate",
    "with_plugin_sources",
]
