"""What a `posenc train -m` sweep varies, and the overrides that name its directories after it:
the sweep's from the swept keys (unless the command or an experiment names it), each job's from
its swept values only (Hydra's own override_dirname.exclude_keys). Used by
posenc/cli/hydra_entry.py before Hydra starts the sweep."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from posenc.config import group_options, parse_overrides
from posenc.record.directory import sweep_name


def swept_keys(argv_overrides: list[str], cfg: DictConfig) -> dict[str, list]:
    """{key: values} of what a -m sweep varies: the command's sweep overrides (a,b / range(..))
    and the sweeper's params that a config sets (experiment files)."""

    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    parsed = [*parse_overrides(argv_overrides), *parse_overrides([f"{k}={v}" for k, v in params.items()])]
    swept: dict[str, list] = {}
    for o in parsed:
        if o.override.is_sweep_override() and o.key not in swept:
            swept[o.key] = _sweep_values(o.key, o.value)
    return swept


def _sweep_values(key: str, value) -> list:
    """A sweep override's values; a glob(...) over a config group, the options it matches."""
    from hydra.core.override_parser.types import Glob


    if isinstance(value, Glob):
        try:
            return value.filter(group_options(key))
        except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError):
            return [f"glob({','.join(value.include)})"]
    return list(value)


def sweep_naming(argv_overrides: list[str], swept: dict[str, list], cfg: DictConfig) -> list[str]:
    """The overrides that name a sweep's directories: name=<swept keys> when neither the command
    nor an experiment names it, and the keys a job's directory leaves out (the fixed ones, as
    Hydra's own override_dirname.exclude_keys), so it shows only the swept values."""

    added = [] if cfg.get("name") else [f"name='{sweep_name(swept)}'"]  # quoted: its commas are no sweep
    fixed = {o.key for o in parse_overrides(argv_overrides) if not o.key.startswith("hydra") and o.key not in swept}
    fixed.add("name")
    exclude = ",".join("'" + k.replace("\\", "\\\\").replace("'", "\\'") + "'" for k in sorted(fixed))
    return [*added, f"hydra.job.config.override_dirname.exclude_keys=[{exclude}]"]
