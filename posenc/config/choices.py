"""The per-choice schema: the ``__init__`` of the class a group's ``_target_`` names is the schema
of its YAML (encoding, dataset, tokenizer), so a new encoding is one module plus one YAML. The
``__init__`` is read from the class's source (signatures.py), so checking a config imports no torch."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import typing
from dataclasses import field
from functools import lru_cache
from typing import Any

from hydra.utils import get_class
from omegaconf import MISSING, DictConfig, OmegaConf

from posenc.config.signatures import Unreadable, read_signature
from posenc.errors import UserError

#: groups whose keys are the constructor arguments of the class ``_target_`` names
CHOICE_GROUPS = ("encoding", "dataset", "tokenizer")


def _supported(annotation: Any) -> Any:
    """annotation if OmegaConf can type a field with it, else Any (Literal, unions of containers…)."""
    probe = dataclasses.make_dataclass("probe", [("x", annotation, field(default=MISSING))])
    try:
        OmegaConf.structured(probe)
    except Exception:  # noqa: BLE001 - OmegaConf says "unsupported" in several ways
        return Any
    return annotation


@lru_cache(maxsize=None)
def choice_schema(target: str) -> type | None:
    """A dataclass with one field per argument of target's ``__init__``, typed by its annotation
    (Any where it has none). Hydra's own keys (``_target_``…) are Any; a class taking
    ``**kwargs`` gets no schema (None): any key is valid for it. The arguments are read from the
    class's source (signatures.py: no torch is imported to refuse a typo); a class the source does
    not settle is imported and asked."""
    try:
        signature = read_signature(target)
        if signature.var_keyword:
            return None
        arguments = [(p.name, p.annotation) for p in signature.parameters if p.keyword]
    except Unreadable:
        arguments = imported_arguments(target)
        if arguments is None:
            return None
    fields = [(name, _supported(annotation), field(default=MISSING)) for name, annotation in arguments if name != "self"]
    fields += [(key, Any, field(default=MISSING)) for key in ("_target_", "_partial_", "_convert_", "_recursive_")]
    return dataclasses.make_dataclass(target.rpartition(".")[2], fields)


def imported_arguments(target: str) -> list[tuple[str, Any]] | None:
    """(name, annotation) of each positional-or-keyword and keyword-only argument of target's
    ``__init__``, from the imported class (None: it takes ``**kwargs``)."""
    import_module_of(target)  # a plugin module that cannot be imported: one line saying how to fix it
    cls = get_class(target)
    signature = inspect.signature(cls.__init__)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - an annotation naming what only a type checker imports
        hints = {}
    return [(name, hints.get(name, Any)) for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def apply_choice_schemas(cfg: DictConfig) -> DictConfig:
    """Check and type the encoding, dataset and tokenizer nodes of cfg in place against the
    schema of their ``_target_``: a wrong type or an unknown key raises OmegaConf's
    ValidationError / ConfigKeyError naming ``<group>.<key>``. Interpolations are checked
    through their value and kept as they are. A node nested in one (a mechanism's
    ``encoding.inner``) is checked against its own ``_target_`` the same way."""
    for group in CHOICE_GROUPS:
        node = cfg.get(group)
        if isinstance(node, DictConfig) and "_target_" in node:
            _apply_schema(node, group)
    return cfg


def _apply_schema(node: DictConfig, name: str) -> None:
    for key in _plain_keys(node):
        child = node[key]
        if isinstance(child, DictConfig) and "_target_" in child:
            _apply_schema(child, f"{name}.{key}")
    schema = choice_schema(node._target_)
    if schema is None:
        return
    # merged under the node's full name, so OmegaConf's error names the full key
    *path, last = name.split(".")
    wrap = lambda value: functools.reduce(lambda inner, part: {part: inner}, reversed(path), {last: value})  # noqa: E731
    typed = OmegaConf.merge(wrap(OmegaConf.structured(schema)), wrap(OmegaConf.to_container(node, resolve=True)))
    typed = OmegaConf.select(typed, name)
    for key in _plain_keys(node):
        if not isinstance(node[key], DictConfig):
            node[key] = typed[key]


def _plain_keys(node: DictConfig) -> list:
    """The keys holding a value of their own: not an interpolation (kept as written, resolved
    where it is used) and not MISSING."""
    return [k for k in node if not OmegaConf.is_interpolation(node, k) and not OmegaConf.is_missing(node, k)]


def import_module_of(target: str):
    """The module of ``a.b.Class``, imported; an ImportError as one line naming the module and how
    to make it importable."""
    module_name = target.rpartition(".")[0]
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise unimportable(target, e) from e


def unimportable(target: str, error: BaseException, import_root: str | None = None) -> UserError:
    """The one line for a ``_target_`` whose module cannot be imported. import_root: the directory
    the run imported it from (provenance.json), when known."""
    module = target.rpartition(".")[0]
    cause = error.__cause__ if isinstance(error.__cause__, ImportError) else error
    missing = getattr(cause, "name", None)
    if missing and not module.startswith(missing) and missing != module:  # the module imports something absent
        return UserError(f"cannot import {module} (for {target}): it imports '{missing}', which is not installed — "
                         f"pip install it in this environment")
    where = f"PYTHONPATH={import_root} (where the run imported it from)" if import_root else \
        "PYTHONPATH=<the directory holding it>"
    return UserError(f"cannot import module '{module}' (encoding._target_ {target}) — make it importable: "
                     f"{where}, or pip install -e <its project>")
