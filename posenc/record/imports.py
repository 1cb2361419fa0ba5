"""Which source files importing a module runs, within its own top-level package.

Importing ``myplug.encodings`` runs ``myplug/__init__.py`` and ``myplug/encodings.py``, and every
module of ``myplug`` that encodings.py imports, transitively (``import myplug.helpers``,
``from .helpers import f``, ``from . import helpers``, at the top of the file or inside a
function). That is the code an encoding was built from: what a run's provenance hashes
(posenc/record/provenance.py). It is read from the source with ``ast``, not from ``sys.modules``, so
the set is the same in every process, whatever else that process imported; modules outside the
top-level package are not followed, unless named (``also``: a plug-in's encoding runs the posenc
modules it imports, and provenance follows them; torch and other libraries never). A file that
holds nothing but whitespace (an empty ``__init__.py``) runs no code and is left out, so adding one
changes nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path


def module_file(root: Path, name: str) -> Path | None:
    """The source file of module ``name`` under the import root: a/b.py or a/b/__init__.py."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_names(source: str, name: str, is_package: bool) -> set[str]:
    """Every module name an import statement in source (module ``name``) may load: ``import a.b``
    gives a and a.b; ``from a import b`` gives a and a.b (b may be a submodule); relative imports
    are resolved against the module's package."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                module = ".".join(filter(None, [base, node.module]))
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")]
        else:
            continue
        for target in filter(None, targets):  # a.b.c loads a, a.b and a.b.c
            pieces = target.split(".")
            out.update(".".join(pieces[:i]) for i in range(1, len(pieces) + 1))
    return out


def package_sources(name: str, root: Path, also: Mapping[str, Path] | None = None) -> list[Path]:
    """The files importing module ``name`` (found under the import root ``root``) runs within its
    top-level package: the module, the __init__.py of each package above it, and the package's
    modules they import, transitively; empty files left out. Sorted. also: other top-level packages
    to follow imports into, each with its import root ({"posenc": <where posenc is>}: a plug-in's
    encoding runs the posenc modules it imports, and theirs)."""
    roots = {name.partition(".")[0]: root, **(also or {})}
    seen: set[str] = set()
    files: set[Path] = set()
    todo = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)]  # a, a.b, a.b.c
    while todo:
        current = todo.pop()
        top = current.partition(".")[0]
        if current in seen or top not in roots:
            continue
        seen.add(current)
        path = module_file(roots[top], current)
        if path is None:
            continue  # a namespace package (no __init__.py), or a name that is not a module (a class)
        runs, names = file_imports(str(path), current, path.name == "__init__.py", *stamp(path))
        if runs:
            files.add(path)
        todo += sorted(names)
    return sorted(files)


def stamp(path: Path) -> tuple[int, int]:
    """(mtime in ns, size): a file read again only when it changed."""
    info = path.stat()
    return info.st_mtime_ns, info.st_size


@lru_cache(maxsize=1024)
def file_imports(path: str, name: str, is_package: bool, mtime_ns: int, size: int) -> tuple[bool, frozenset[str]]:
    """(whether the file holds anything but whitespace, the module names it imports), read once per
    version of the file (a verdict's key reads some eighty of posenc's files on every lookup)."""
    source = Path(path).read_text()
    return bool(source.strip()), frozenset(imported_names(source, name, is_package))
