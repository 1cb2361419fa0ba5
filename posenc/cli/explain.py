"""Every error a user can cause, as one line: what went wrong — what to do instead.

Configuration errors are Hydra's and OmegaConf's own exceptions (the schema in posenc/config/schema.py
refuses a wrong type or an unknown key while composing); the line is built from their fields
(the key, the value, the node's type hint, the keys next to it), never from their text.
"""

from __future__ import annotations

import difflib
import typing

from posenc.config import (
    CHOICE_GROUPS,
    CONFIG_MODULE,
    choice_schema,
    encoding_options,
    group_options,
)
from posenc.errors import UserError

SEE_KEYS = "`posenc train --cfg job` shows every key and its value"


def explain(e: BaseException) -> str:
    """One line: what went wrong — what to do instead."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )

    if isinstance(e, UserError):
        return str(e)
    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, choice = e.missing_cfg_file.rpartition("/")
        options = ", ".join(e.options or [])
        if group:
            if options:
                close = difflib.get_close_matches(choice, e.options, n=1, cutoff=0.6)
                hint = f"did you mean {group}={close[0]}? " if close else ""
                return f"unknown {group} '{choice}' — {hint}choose one of: {options}"
            return f"unknown {group} '{choice}' — there is no conf/{group}/{choice}.yaml; add it or check the spelling"
        return f"no config '{choice}' — check --config-name / --config-dir"
    if isinstance(e, OverrideParseException):
        return f"cannot parse override '{e.override}' — write key=value, a group choice, or a,b,c with -m"
    cause = _omegaconf_error(e)
    if cause is not None:
        line = config_error(cause, context=_lines(str(e))[0] if cause is not e else "")
        if cause is e.__context__ and cause is not e.__cause__:
            # Hydra re-raised a YAML file's error without chaining it: its first line names the file
            line = f"{_lines(str(e))[0]} {line}"
        return line
    if isinstance(e, ConfigCompositionException):  # Hydra's own message: first line — the rest
        first, *rest = _lines(str(e))
        return f"{first} — {' '.join(rest) or SEE_KEYS}"
    return f"{type(e).__name__}: {_lines(str(e))[0]} (run with --debug for the traceback)"


def config_error(error, context: str = "") -> str:
    """An OmegaConf error (ValidationError, ConfigKeyError, …) as one line, from its fields."""
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    what = _lines(str(error))[0]  # OmegaConf's message; the lines after it repeat its fields
    key = error.full_key or ""
    if isinstance(error, (ConfigKeyError, ConfigAttributeError)) and key.partition(".")[0] in CHOICE_GROUPS \
            and key.count(".") == 1 and isinstance(error.parent_node, DictConfig):
        line = missing_option(key, error.parent_node)
        if line is not None:
            return line
    if isinstance(error, (ConfigKeyError, ConfigAttributeError)) and "." not in key and key:
        return unknown_top_level(key, error.parent_node, context)
    if isinstance(error, (ConfigKeyError, ConfigAttributeError)) and "." in key:
        parent = error.parent_node
        known = [f"{key.rpartition('.')[0]}.{k}" for k in parent.keys()] if isinstance(parent, DictConfig) else []
        close = difflib.get_close_matches(key, [k for k in known if not k.rpartition(".")[2].startswith("_")], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"unknown config key '{key}' ({what}) — {hint}{SEE_KEYS}"
    if isinstance(error, ValidationError) and "." in key:
        hint = declared_type(error.parent_node, key.rpartition(".")[2])
        expected = _type_name(hint) if hint is not None else None
        takes = f"{key} takes {expected}; " if expected else ""
        return f"{key}={error.value}: {what} — {takes}{SEE_KEYS}"
    where = context or (f"at {key}" if key else "in the configuration")
    return f"{where}: {what} — {SEE_KEYS}"


def missing_option(key: str, node) -> str | None:
    """encoding.style on alibi: 'alibi has no option style (rope, p_rope, xpos have it)', the
    others read from each choice's own config (conf/<group>/<choice>.yaml, what it extends included)."""
    group, _, option = key.partition(".")
    choice = node.get("name") or group
    unset = unset_argument(group, option, node, choice)
    if unset is not None:
        return unset
    owners = [c for c in group_options(group) if c != choice and option in choice_keys(group, c)]
    if owners:
        listed = " — `posenc encodings` lists every encoding's options" if group == "encoding" else ""
        return (f"{choice} has no option {option} ({', '.join(owners)} {'has' if len(owners) == 1 else 'have'} it): "
                f"choose one of those with {group}=…, or drop {key}{listed}")
    return None  # no other choice has it: a typo, answered as any unknown key


def unset_argument(group: str, option: str, node, choice: str) -> str | None:
    """The line for an argument the chosen class takes but its YAML does not set (Hydra's
    ``key=value`` only changes a key the YAML has), or None when the class has no such argument."""
    import dataclasses


    target = node.get("_target_")
    schema = choice_schema(target) if isinstance(target, str) else None
    if schema is None or option not in {f.name for f in dataclasses.fields(schema)}:
        return None
    return (f"{group}.{option} is an argument of {target}, but {group}/{choice}.yaml does not set it, so Hydra has "
            f"no key to change — add `{option}: <its default>` to that YAML, or add the key from the command line: "
            f"+{group}.{option}=…")


def choice_keys(group: str, choice: str) -> set[str]:
    """The keys a group's choice sets: an encoding's options (what it extends included), else its YAML's keys."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    if group == "encoding":
        return set(encoding_options(choice))
    return set(OmegaConf.load(files(CONFIG_MODULE).joinpath(group, f"{choice}.yaml").open()).keys())


def unknown_top_level(key: str, root, context: str) -> str:
    """traner.max_steps=5: the key typed (Hydra names it in its message) and the nearest existing one."""
    import re

    from omegaconf import DictConfig, OmegaConf

    typed = re.search(r"override '([^']+)'", context)  # Hydra's ConfigCompositionException names the override
    typed_key = typed[1] if typed else key
    rest = typed_key.partition(".")[2]
    known = []
    if isinstance(root, DictConfig):
        for top in root.keys():
            node = OmegaConf.select(root, str(top), default=None, throw_on_missing=False)
            known += [f"{top}.{k}" for k in node.keys()] if isinstance(node, DictConfig) else [str(top)]
    close = difflib.get_close_matches(typed_key, known, n=1, cutoff=0.75) if rest else []
    close = close or difflib.get_close_matches(key, [str(k) for k in getattr(root, "keys", list)()], n=1)
    if close and rest and "." not in close[0]:
        close = [f"{close[0]}.{rest}"]
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown config key '{typed_key}' (there is no '{key}') — {hint}{SEE_KEYS}"


def _omegaconf_error(e: BaseException):
    """e, or the OmegaConf error Hydra raised e from (or while handling), or None."""
    from omegaconf.errors import OmegaConfBaseException

    for candidate in (e, e.__cause__, e.__context__):
        if isinstance(candidate, OmegaConfBaseException):
            return candidate
    return None


def declared_type(parent, key: str):
    """The type the schema declares for parent.key (a dataclass field's annotation), or None."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    cls = OmegaConf.get_type(parent) if isinstance(parent, DictConfig) else None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    try:
        return typing.get_type_hints(cls).get(key)
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated here
        return {f.name: f.type for f in dataclasses.fields(cls)}.get(key)


def _type_name(hint) -> str:
    """int -> 'an int', Optional[float] -> 'a float or null', List[float] -> 'a list of float'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        names = [_bare(a) for a in args if a is not type(None)]
        return "a " + " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"a list of {' or '.join(_bare(a) for a in args) or 'values'}"
    if origin is dict:
        return "a mapping"
    article = "an" if _bare(hint)[0] in "aeiou" else "a"
    return f"{article} {_bare(hint)}"


def _bare(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return "|".join(_bare(a) for a in args)
    return {bool: "bool (true or false)"}.get(hint, getattr(hint, "__name__", str(hint)))


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()] or [text]
