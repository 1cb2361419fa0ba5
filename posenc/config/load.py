"""Reading a config outside a Hydra run: ``compose`` (what every command but `posenc train`
composes through) and ``typed_run_config`` (a run directory's saved config, as its RunDir read
it, typed, with overrides)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from posenc.config import searchpath
from posenc.config.choices import apply_choice_schemas
from posenc.config.overrides import parse_overrides
from posenc.config.schema import PosencConfig
from posenc.config.searchpath import CONFIG_MODULE, CONFIG_PATH, with_plugin_sources
from posenc.errors import UserError

#: composed configs by (overrides, bench, plugin stamp): composing reads ~16 YAML files through
#: Hydra (~0.3 s); `posenc check`, `bench` and `benchmark` compose the same overrides again and again
_COMPOSED: dict[tuple, DictConfig] = {}
_MAX_COMPOSED = 128


def compose(overrides: list[str], bench: bool = True) -> DictConfig:
    """conf/config.yaml (+ conf/bench/default.yaml for `posenc bench`) with the user's overrides,
    outside a Hydra run (no run dir, no logging), typed by the schema. The one function every
    command but `posenc train` composes through: its search path (posenc/config/searchpath.py) holds
    the plugins' config directories, so a plugin's encoding is an option like a built-in one.

    Composed by Hydra's public compose API (``hydra.compose`` under ``initialize_config_module``), once
    per process for the same overrides and plugin files (a copy each call: callers may change
    theirs); a plugin YAML written or edited since is read again."""
    key = (tuple(overrides), bench, _plugin_stamp())
    if key not in _COMPOSED:
        if len(_COMPOSED) >= _MAX_COMPOSED:
            _COMPOSED.pop(next(iter(_COMPOSED)))  # the oldest
        _COMPOSED[key] = _compose(list(overrides), bench)
    return copy.deepcopy(_COMPOSED[key])


def _plugin_stamp() -> tuple:
    """The plugins' config sources, and the path, time and size of every YAML file in those that
    are directories. posenc's own conf/ is part of the installed package and read as it was."""
    stamp: list = []
    for url in searchpath.plugin_sources():
        stamp.append(url)
        scheme, _, where = url.partition("://")
        if scheme == "file" and Path(where).is_dir():
            stamp += [(str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(Path(where).rglob("*.yaml"))]
    return tuple(stamp)


def _compose(overrides: list[str], bench: bool) -> DictConfig:
    from hydra import compose as hydra_compose

    with hydra_initialized():
        cfg = hydra_compose("config", overrides=with_plugin_sources([*(["+bench=default"] if bench else []), *overrides]),
                            return_hydra_config=True)
    searchpath.warn_shadowed(cfg.hydra.runtime.choices)  # a chosen file that another source also holds
    with open_dict(cfg):
        del cfg["hydra"]  # as hydra.compose(return_hydra_config=False)
    return apply_choice_schemas(cfg)


@contextmanager
def hydra_initialized(primary: str | None = None) -> Iterator[None]:
    """Hydra's compose API set up (job name posenc) on posenc's conf/, or on primary (`posenc train
    --config-path`: a directory, absolute or from the working directory, or pkg://<module>), through
    Hydra's public initialize_config_module / initialize_config_dir. Hydra's global state is left as
    it was found, but cleared first if another caller left it set (as Hydra's own app does)."""
    from hydra import initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    primary = primary or CONFIG_PATH
    if primary.startswith("pkg://"):
        initialized = initialize_config_module(primary.removeprefix("pkg://"), job_name="posenc", **version_base())
    else:
        initialized = initialize_config_dir(str(Path(primary).expanduser().resolve()), job_name="posenc", **version_base())
    with initialized:
        yield


def version_base() -> dict[str, str]:
    """Which Hydra's defaults to use: 1.3 asks (unasked, it takes 1.1's and warns), 1.4 deprecates
    the question (asked, it warns) and takes its own."""
    import hydra

    major, minor = (int(part) for part in hydra.__version__.split(".")[:2])
    return {"version_base": "1.3"} if (major, minor) < (1, 4) else {}


def typed_run_config(saved: DictConfig, overrides: list[str]) -> DictConfig:
    """A run's saved config (.hydra/config.yaml, read by its RunDir: posenc.record.rundir.load_run_config)
    typed by the schema, with Hydra-syntax overrides of existing keys (``+key=value`` adds one)."""
    saved = copy.deepcopy(saved)  # the RunDir's copy is shared: read-only
    OmegaConf.set_readonly(saved, False)
    if "layout" not in saved:  # runs made before layouts: every layer global
        saved["layout"] = OmegaConf.load(files(CONFIG_MODULE).joinpath("layout", "uniform.yaml").open())
    # eval keys added since the run was made (eval.packing, eval.batch_tokens) take today's defaults,
    # so the evaluators read cfg.eval.<key> with no default of their own
    saved["eval"] = OmegaConf.merge(OmegaConf.load(files(CONFIG_MODULE).joinpath("eval", "default.yaml").open()),
                                    saved.get("eval") or {})
    for group in ("model", "encoding", "dataset", "tokenizer"):  # runs made before the subpackages
        target = OmegaConf.select(saved, f"{group}._target_")
        if isinstance(target, str) and target.rpartition(".")[0] in MOVED_MODULES:
            module, _, name = target.rpartition(".")
            saved[group]["_target_"] = f"{MOVED_MODULES[module]}.{name}"
    cfg = OmegaConf.merge(OmegaConf.structured(PosencConfig), saved)
    OmegaConf.set_struct(cfg, True)  # a key the run does not have is an error, as in `posenc train`
    for key, value, o in parse_overrides(overrides):
        if isinstance(OmegaConf.select(cfg, key, default=None), DictConfig):
            raise UserError(f"'{key}' is a config group; `posenc eval` can change its keys ({key}.<key>=…), not swap it")
        OmegaConf.update(cfg, key, value, merge=False, force_add=o.is_add())
    return apply_choice_schemas(cfg)


#: where the classes named by ``_target_`` in run dirs written before 0.2 live now
MOVED_MODULES = {"posenc.model": "posenc.nn.model", "posenc.tokenizers": "posenc.data.tokenizers",
                 "posenc.corpora": "posenc.data.hub_corpora", "posenc.data": "posenc.data.corpora",
                 **{f"posenc.encodings.{m}": f"posenc.nn.encodings.{m}"
                    for m in ("alibi", "learned", "nope", "rope", "sinusoidal", "t5_bias", "xpos")}}
