"""What a source file's code is, apart from how it is written: its syntax tree (``ast``) without
comments, docstrings, blank lines or line numbers, and the definitions in it, each hashed on its own.

A run's provenance (posenc/record/provenance.py) hashes the files its encoding's code imports this
way, so that a comment, a reflowed line or a reworded docstring is not a change (none of them runs)
and a one-line change in a method is named as that method (``RoPE.transform_qk``). Docstrings are
left out as comments are: Python keeps them as ``__doc__``, which no encoding reads to compute
anything. What is hashed is ``ast.dump`` of the tree, which is the same for the same code in every
process and for every formatting of it, on the Python that runs.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

#: how a definition's hash is shortened in provenance.json (a change, not an attacker, is detected)
SHORT = 16
#: the names statements that are not a def or a class are filed under
IMPORTS, MODULE_CODE = "imports", "module code"

Defined = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """tree with the docstring of its module, every class and every function removed (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]  # a function that is only a docstring still parses
    return tree


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _dump(node: ast.AST) -> str:
    return ast.dump(node, include_attributes=False)  # no line or column numbers


def _statement_name(node: ast.stmt) -> str:
    """What a module-level statement that is not a def or class is filed under: the names it
    assigns (``CHUNK``, ``H, B``), ``imports``, else ``module code``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return IMPORTS
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return ", ".join(names) if names else MODULE_CODE


@lru_cache(maxsize=512)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[str | None, dict[str, str]]:
    """(digest of the whole file's code, or None where it holds none; {definition: short hash}),
    read once per version of the file (its modification time and size)."""
    tree = _without_docstrings(ast.parse(Path(path).read_text(), filename=path))
    parts: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for method in methods:
                parts.setdefault(f"{node.name}.{method.name}", []).append(_dump(method))
            rest = [n for n in node.body if n not in methods]  # bases, decorators, class attributes
            parts.setdefault(node.name, []).append(_dump(node.__class__(
                name=node.name, bases=node.bases, keywords=node.keywords, body=rest or [ast.Pass()],
                decorator_list=node.decorator_list, **({"type_params": node.type_params}
                                                        if hasattr(node, "type_params") else {}))))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.setdefault(node.name, []).append(_dump(node))
        elif not isinstance(node, ast.Pass):
            parts.setdefault(_statement_name(node), []).append(_dump(node))
    definitions = {name: _hash("\n".join(dumps))[:SHORT] for name, dumps in parts.items()}
    return (_hash(_dump(tree)) if definitions else None), definitions


def code_of(path: Path) -> tuple[str | None, dict[str, str]]:
    """path's code as (a SHA-256 of its syntax tree without docstrings, or None for a file that
    runs nothing: empty, comments, a docstring; {each def, class, Class.method and module-level
    name: a short hash of its own})."""
    stat = path.stat()
    return _parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def changed_definitions(then: dict[str, str], now: dict[str, str]) -> list[str]:
    """'RoPE.transform_qk changed', 'helper (new)', 'old (gone)': the definitions that differ."""
    return ([f"{name} changed" for name in then if name in now and then[name] != now[name]]
            + [f"{name} (new)" for name in now if name not in then]
            + [f"{name} (gone)" for name in then if name not in now])
