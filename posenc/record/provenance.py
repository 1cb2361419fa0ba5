"""Where a run's encoding code came from, so a later command can tell when it changed.

A run directory's ``provenance.json``, written when training starts, records for every class an
encoding config names (``_target_``, a mechanism's ``inner`` and a layout kind's own encoding
included): its module, the module's source file, the directory it was imported from, and the code
importing it runs (``sources``, by path under its import root): the module, the __init__.py files
of its packages and the modules it imports, transitively, both within its own package and within
posenc (posenc/record/imports.py): a plug-in that subclasses posenc's RoPE runs posenc's rope.py,
base.py and what they import, and so does posenc's own RoPE. Each file is hashed as code, not as
text (posenc/record/code.py: its syntax tree without comments, docstrings or layout), and each of
its definitions on its own (``definitions``), so a comment or a reflowed line is no change and a
changed one is named (``posenc/nn/encodings/rope.py: RoPE.transform_qk changed``). A file that
runs nothing (an empty or docstring-only __init__.py) is left out. ``sha256`` is one digest over
them all: what `posenc check`'s cached verdicts are keyed by (posenc/check/verdict.py). It also
records the plugin config directories the run was composed with, so a resume composes with them
from any directory.

``posenc eval`` and ``posenc probe`` warn (one line naming every definition that changed, was added
or is gone, file by file) when the code differs now, and ``eval.json`` records the list; a resume
refuses (one ``error:`` line) unless ``trainer.allow_code_change=true`` (posenc/cli/launch.py).
Records written before this (hashes of file bytes, ``hashing`` absent) are compared as they were
taken: each file's bytes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from posenc.config.choices import import_module_of, unimportable
from posenc.config.searchpath import add_config_dirs, plugin_sources
from posenc.errors import UserError
from posenc.record.code import changed_definitions, code_of
from posenc.record.directory import write_json_atomic
from posenc.record.imports import module_file, package_sources
from posenc.record.rundir import RunDir

#: how the sources are hashed: their code (posenc/record/code.py); records without it hashed bytes
HASHING = "ast"
ALLOW_KEY = "trainer.allow_code_change"


def posenc_version() -> str:
    try:
        return version("posenc")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def encoding_targets(cfg: DictConfig) -> list[str]:
    """Every ``_target_`` under cfg.encoding and the layout kinds' own encodings, in order."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, DictConfig):
            for key in node:
                if key == "_target_" and isinstance(node[key], str):
                    found.append(node[key])
                elif not OmegaConf.is_interpolation(node, key) and not OmegaConf.is_missing(node, key):
                    walk(node[key])
        elif isinstance(node, ListConfig):
            for item in node:
                walk(item)

    walk(cfg.get("encoding"))
    walk(OmegaConf.select(cfg, "layout.kinds", default=None))
    return list(dict.fromkeys(found))


def locate(target: str) -> tuple[str, Path, Path]:
    """(module name, its source file, its import root) of ``a.b.Class``, found without importing
    it (so a command that only asks whether code changed loads no torch); one ``error:`` line
    naming the module where it cannot be found (``unimportable``)."""
    module_name = target.rpartition(".")[0]
    top = module_name.partition(".")[0]
    root = import_root_of(top)
    while root is not None and module_name:
        file = module_file(root, module_name)
        if file is not None:
            return module_name, file, root
        module_name = module_name.rpartition(".")[0]  # a nested attribute: a.b.Outer.Inner
    module = import_module_of(target)  # not a source file under a root (an unusual finder): ask the import
    file = getattr(module, "__file__", None)
    if file is None or not file.endswith(".py"):
        raise unimportable(target, ImportError(f"{module.__name__} has no Python source file"))
    depth = module.__name__.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return module.__name__, Path(file), Path(file).resolve().parents[depth]


def import_root_of(top: str) -> Path | None:
    """The directory a top-level package or module is imported from (a sys.path entry, or where an
    editable install's finder points), without running it; None where it cannot be found."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: the folder above it
        return Path(next(iter(spec.submodule_search_locations))).resolve().parent
    return Path(spec.origin).resolve().parent if spec.origin and spec.origin.endswith(".py") else None


def posenc_root() -> Path:
    """Where posenc's own modules are imported from."""
    return Path(__file__).resolve().parents[2]


def covered_files(module_name: str, root: Path) -> list[Path]:
    """What importing the module runs, within its own top-level package and within posenc, the
    files that run no code left out (posenc/record/imports.py, code.py)."""
    files = package_sources(module_name, root, also={"posenc": posenc_root()})
    return [path for path in files if code_of(path)[0] is not None]


def _relative(path: Path, root: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(root) if path.is_relative_to(root) else path.name)


def _where(path: Path, root: Path) -> str:
    """A covered file's name in a record: under posenc's root for posenc's own, else under the
    module's import root (``myplug/distances.py``)."""
    path = path.resolve()
    for base in (root, posenc_root()):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)


def code_record(target: str) -> dict:
    """module, file, import_root, hashing, sources ({file: SHA-256 of its code}), definitions ({file:
    {definition: short hash}}) and sha256 (over every file's name and code) of target."""
    module_name, file, root = locate(target)
    root = root.resolve()
    sources, definitions = {}, {}
    for path in covered_files(module_name, root):
        name = _where(path, root)
        sources[name], definitions[name] = code_of(path)
    digest = hashlib.sha256("".join(f"{name}\0{sources[name]}\0" for name in sorted(sources)).encode()).hexdigest()
    return {"module": module_name, "file": str(file.resolve()), "import_root": str(root), "hashing": HASHING,
            "sources": sources, "definitions": definitions, "sha256": digest}


def code_changes(then: dict, now: dict) -> list[str]:
    """What differs between two records, file by file: 'posenc/nn/encodings/rope.py: RoPE.transform_qk
    changed', 'myplug/helpers.py (new)', 'myplug/old.py (gone)'."""
    before, after = then["sources"], now["sources"]
    out = []
    for name in sorted(before.keys() & after.keys()):
        if before[name] == after[name]:
            continue
        named = changed_definitions(then.get("definitions", {}).get(name, {}), now["definitions"].get(name, {}))
        out.append(f"{name}: {', '.join(named)}" if named else f"{name} changed (the order of its statements)")
    return (out + [f"{name} (new)" for name in sorted(after.keys() - before.keys())]
            + [f"{name} (gone)" for name in sorted(before.keys() - after.keys())])


def _byte_changes(then: dict) -> list[str]:
    """A record written before code hashing: each file it lists, its bytes then and now."""
    root = Path(then.get("import_root") or "/")
    out = []
    for name, sha in sorted(then["sources"].items()):
        path = root / name
        if not path.is_file():
            out.append(f"{name} (gone)")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            out.append(f"{name} changed")
    return out


def _legacy_digest(target: str) -> str:
    """The hash a record written before per-file hashes took: every .py of a plugin's top-level
    package, or the module file for posenc's own, names and bytes."""
    module = import_module_of(target)
    root = Path(module.__file__).resolve().parents[module.__name__.count(".") +
                                                   (1 if Path(module.__file__).name == "__init__.py" else 0)]
    top = sys.modules.get(module.__name__.partition(".")[0])
    if module.__name__.startswith("posenc.") or top is None or not getattr(top, "__path__", None) \
            or not getattr(top, "__file__", None):
        files = [Path(module.__file__)]
    else:
        files = sorted(Path(top.__file__).parent.rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(_relative(path, root).encode())
        digest.update(b"\0" + path.resolve().read_bytes() + b"\0")
    return digest.hexdigest()


def record(cfg: DictConfig) -> dict:
    """What provenance.json holds for a run composed as cfg."""
    return {"posenc_version": posenc_version(), "config_dirs": plugin_sources(),
            "code": {target: code_record(target) for target in encoding_targets(cfg)}}


def write(run: RunDir | Path, cfg: DictConfig) -> dict:
    """Record cfg's encoding code in the run's provenance.json (a resume told to go on keeps the
    earlier records)."""
    run = RunDir.of(run)
    now = record(cfg)
    before = run.provenance()
    if before is not None:
        if before.get("code") != now["code"] or before.get("posenc_version") != now["posenc_version"]:
            now["earlier"] = [*before.pop("earlier", []), before]
        else:
            now["earlier"] = before.get("earlier", [])
    write_json_atomic(run.provenance_file, now)
    return now


def changes(run: RunDir | Path) -> list[str]:
    """What differs between the code the run was trained with and the code importable now, one
    phrase per class (empty: the same, or a run made before provenance was recorded). A module
    that cannot be imported now is refused with the directory the run imported it from."""
    saved = RunDir.of(run).provenance()
    if saved is None:
        return []
    out = []
    for target, then in saved.get("code", {}).items():
        try:
            now = code_record(target)
        except UserError as e:
            raise unimportable(target, e.__cause__ or e, then.get("import_root")) from e
        moved = "" if now["file"] == then["file"] else f"; now from {now['file']}"
        if then.get("hashing") == HASHING:
            found = code_changes(then, now)
        elif "sources" in then:  # per-file hashes of bytes
            found = _byte_changes(then)
        else:  # one hash over the files it covered
            legacy = _legacy_digest(target)
            found = [] if legacy == then["sha256"] else [
                f"{then['file']}: sha256 {then['sha256'][:12]} then, {legacy[:12]} now"]
        if found or moved:
            out.append(f"{target} ({'; '.join(found) or 'the same code'}{moved})")
    return out


def restore_config_dirs(run: RunDir | Path) -> None:
    """Add the plugin config directories the run was composed with to this process's search path
    (a resume composes the run again), those that still exist."""

    saved = RunDir.of(run).provenance() or {}
    dirs = [url.removeprefix("file://") for url in saved.get("config_dirs", []) if url.startswith("file://")]
    add_config_dirs([d for d in dirs if Path(d).is_dir()])
