"""A class's constructor parameters read from its source with ``ast``, without importing it.

The encoding, dataset and tokenizer nodes of a config are typed by the ``__init__`` of the class
their ``_target_`` names (choices.py). Importing those classes imports torch (every encoding is an
``nn.Module``), which takes seconds: a typo in an override would wait for torch before it is
refused. So the parameters are read from the module's source instead: the class found where the
module defines or imports it (``nope.NoPE`` is ``base.NoPE`` re-exported), its own ``__init__``, else
its base class's (``NoPE`` takes ``PositionalEncoding``'s), a ``@dataclass``'s fields, and each
annotation evaluated against the names the module imports from the standard typing modules
(``int | None``, ``list[float]``, ``Optional[str]``); a name from anywhere else (``Tensor``,
``PositionalEncoding``) is ``Any``, as OmegaConf cannot type a field with it anyway.

What the source does not settle (another decorator, several base classes, a metaclass, a module
found nowhere on the path) is ``Unreadable``, and the caller imports the class as before.
tests/test_config_fast.py holds that for every class conf/ names the result is what
``inspect.signature`` and ``typing.get_type_hints`` of the imported class give.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.machinery
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

#: modules whose names an annotation may use (imported on demand: all are part of Python's start-up or cheap)
TYPING_MODULES = ("typing", "collections.abc", "collections", "typing_extensions", "pathlib", "numbers")
#: how deep re-exports and base classes are followed before giving up
MAX_DEPTH = 8


class Unreadable(Exception):
    """The source does not say what the class's constructor takes: import the class instead."""


@dataclass(frozen=True)
class Parameter:
    name: str
    annotation: Any          # evaluated (int, int | None, list[float]); Any where it names something else
    keyword: bool            # positional-or-keyword or keyword-only (not positional-only)


@dataclass(frozen=True)
class Signature:
    parameters: tuple[Parameter, ...]   # ``self`` included, as inspect.signature(cls.__init__) has it
    var_keyword: bool                   # takes **kwargs: any key is valid


def read_signature(target: str) -> Signature:
    """The constructor parameters of the class ``target`` ('pkg.module.Class') names, from source."""
    module, _, name = target.rpartition(".")
    if not module:
        raise Unreadable(target)
    return _signature(module, name, 0)


@lru_cache(maxsize=None)
def _signature(module: str, name: str, depth: int) -> Signature:
    if depth > MAX_DEPTH:
        raise Unreadable(f"{module}.{name}: too deep")
    source = _source(module)
    found = _binding(source.tree, name)
    if isinstance(found, ast.ClassDef):
        return _class_signature(module, source, found, depth)
    if isinstance(found, ast.ImportFrom):
        origin = _import_origin(module, source.is_package, found)
        alias = next(a for a in found.names if (a.asname or a.name) == name)
        return _signature(origin, alias.name, depth + 1)
    raise Unreadable(f"{module}.{name}: not defined at the top of {source.path}")


@dataclass(frozen=True)
class _Source:
    path: Path
    tree: ast.Module
    is_package: bool


@lru_cache(maxsize=None)
def _source(module: str) -> _Source:
    """The parsed source of a module, found without importing it or its packages (a package's
    ``__init__`` may import torch): the top-level package's spec, then each part on its parent's path."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                raise Unreadable(module)
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    except (ImportError, ValueError) as e:
        raise Unreadable(module) from e
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise Unreadable(module)
    path = Path(spec.origin)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError) as e:
        raise Unreadable(module) from e
    return _Source(path, tree, spec.submodule_search_locations is not None)


def _binding(tree: ast.Module, name: str) -> ast.AST | None:
    """The last top-level statement that binds name: a class, an import, or something else (None
    where nothing does); Python keeps the last binding."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            found = node
        elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            found = node
        elif isinstance(node, (ast.Import, ast.FunctionDef, ast.AsyncFunctionDef)):
            bound = [(a.asname or a.name).split(".")[0] for a in node.names] if isinstance(node, ast.Import) else [node.name]
            if name in bound:
                found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
    return found


def _import_origin(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from … import`` statement of module reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(package):
        raise Unreadable(module)
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _class_signature(module: str, source: _Source, cls: ast.ClassDef, depth: int) -> Signature:
    if cls.keywords:  # a metaclass may make any constructor
        raise Unreadable(f"{module}.{cls.name}: class keywords")
    if cls.decorator_list:
        if len(cls.decorator_list) == 1 and _is_plain_dataclass(cls.decorator_list[0]) and not cls.bases:
            return _dataclass_signature(module, source, cls)
        raise Unreadable(f"{module}.{cls.name}: decorated")
    inits = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"]
    if inits:
        init = inits[-1]
        if init.decorator_list or isinstance(init, ast.AsyncFunctionDef):
            raise Unreadable(f"{module}.{cls.name}.__init__: decorated")
        return _function_signature(module, source, init.args)
    if not cls.bases:  # object.__init__(self, /, *args, **kwargs)
        return Signature((Parameter("self", Any, False),), True)
    if len(cls.bases) > 1:  # the method resolution order decides: import it
        raise Unreadable(f"{module}.{cls.name}: several base classes")
    return _base_signature(module, source, cls.bases[0], depth)


def _base_signature(module: str, source: _Source, base: ast.expr, depth: int) -> Signature:
    """The signature of the base class expression ``base`` of a class in module: ``Name`` (defined or
    imported there) or ``module_alias.Name`` (``import a.b as m``, ``from a import b``)."""
    if isinstance(base, ast.Name):
        if base.id == "object":
            return Signature((Parameter("self", Any, False),), True)
        return _signature(module, base.id, depth + 1)
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        bound = _binding(source.tree, base.value.id)
        if isinstance(bound, ast.Import):
            alias = next(a for a in bound.names if (a.asname or a.name).split(".")[0] == base.value.id)
            return _signature(alias.name if alias.asname else base.value.id, base.attr, depth + 1)
        if isinstance(bound, ast.ImportFrom):  # from a import b; class C(b.D)
            origin = _import_origin(module, source.is_package, bound)
            alias = next(a for a in bound.names if (a.asname or a.name) == base.value.id)
            return _signature(f"{origin}.{alias.name}", base.attr, depth + 1)
    raise Unreadable(f"{module}: base class {ast.unparse(base)}")


def _is_plain_dataclass(decorator: ast.expr) -> bool:
    """@dataclass, @dataclasses.dataclass, or either called without init=False."""
    call = decorator if isinstance(decorator, ast.Call) else None
    func = call.func if call else decorator
    named = (isinstance(func, ast.Name) and func.id == "dataclass") or \
        (isinstance(func, ast.Attribute) and func.attr == "dataclass")
    if not named or call is None:
        return named
    return not any(k.arg in ("init", "kw_only") for k in call.keywords)


def _dataclass_signature(module: str, source: _Source, cls: ast.ClassDef) -> Signature:
    """A dataclass's generated __init__: self, then each annotated field that is not a ClassVar."""
    params = [Parameter("self", Any, True)]
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = ast.unparse(node.annotation)
        if "ClassVar" in text or "KW_ONLY" in text or "InitVar" in text:
            raise Unreadable(f"{module}.{cls.name}: {text}")
        if isinstance(node.value, ast.Call) and any(k.arg == "init" for k in node.value.keywords):
            raise Unreadable(f"{module}.{cls.name}.{node.target.id}: field(init=...)")
        params.append(Parameter(node.target.id, _annotation(source, node.annotation), True))
    return Signature(tuple(params), False)


def _function_signature(module: str, source: _Source, args: ast.arguments) -> Signature:
    params = [Parameter(a.arg, _annotation(source, a.annotation), False) for a in args.posonlyargs]
    params += [Parameter(a.arg, _annotation(source, a.annotation), True) for a in [*args.args, *args.kwonlyargs]]
    return Signature(tuple(params), args.kwarg is not None)


def _annotation(source: _Source, node: ast.expr | None) -> Any:
    """An annotation evaluated with the builtins and what the module imports from TYPING_MODULES;
    Any where it has none or names anything else."""
    if node is None:
        return Any
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return Any
    try:
        return eval(compile(ast.Expression(node), "<annotation>", "eval"),  # noqa: S307 - names limited below
                    {"__builtins__": vars(builtins)}, _typing_names(source))
    except Exception:  # noqa: BLE001 - a name from torch or the package itself: OmegaConf would take it as Any
        return Any


@lru_cache(maxsize=None)
def _typing_names(source: _Source) -> dict[str, Any]:
    """The names the module binds from the standard typing modules (``from typing import Any``,
    ``import typing as t``, ``from collections.abc import Sequence``)."""
    names: dict[str, Any] = {}
    for node in source.tree.body:
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in TYPING_MODULES:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    names[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in TYPING_MODULES:
                    top = alias.asname or alias.name.split(".")[0]
                    names[top] = importlib.import_module(alias.name if alias.asname else top)
    return names
