"""Where a run's encoding code came from, so a later command can tell when it changed.

A run directory's ``provenance.json``, written when training starts, records for every class an
encoding config names (``_target_``, a mechanism's ``inner`` and a layout kind's own encoding
included): its module, the module's source file, the directory it was imported from, and a
SHA-256 of each source file importing it runs (``sources``, by path under that directory): for a
plugin package, the module, the package's __init__.py files and the package's modules it imports,
transitively (posenc/record/imports.py; a helper module's change counts, an unrelated file of the
package or an empty __init__.py does not); posenc's own encodings are the module file, and
posenc's version says the rest. It also records the plugin config directories the run was
composed with, so a resume composes with them from any directory.

``posenc eval`` and ``posenc probe`` warn (one line naming every file that changed, was added or
is gone) when the code differs now; a resume refuses (one ``error:`` line) unless
``trainer.allow_code_change=true`` (posenc/cli/launch.py).
"""

from __future__ import annotations

import hashlib
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from posenc.config.choices import import_module_of, unimportable
from posenc.config.searchpath import add_config_dirs, plugin_sources
from posenc.errors import UserError
from posenc.record.directory import write_json_atomic
from posenc.record.imports import package_sources
from posenc.record.rundir import RunDir

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


def _source_files(module) -> tuple[Path | None, list[Path]]:
    """(the module's file, the files its hash covers): the module file for posenc's own modules
    and single-file plugins; for a plugin package, what importing the module runs within it
    (posenc/record/imports.py)."""
    file = getattr(module, "__file__", None)
    if file is None:
        return None, []
    root = _import_root(module)
    if module.__name__.startswith("posenc.") or "." not in module.__name__ or root is None:
        return Path(file), [Path(file)]
    return Path(file), package_sources(module.__name__, Path(root))


def _legacy_files(module) -> list[Path]:
    """The files a record written before ``sources`` hashed: every .py of a plugin's top-level package."""
    top = sys.modules.get(module.__name__.partition(".")[0])
    if module.__name__.startswith("posenc.") or top is None or not getattr(top, "__path__", None) \
            or not getattr(top, "__file__", None):
        return [Path(module.__file__)]
    return sorted(Path(top.__file__).parent.rglob("*.py"))


def _import_root(module) -> str | None:
    """The sys.path entry the module was found under."""
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    depth = module.__name__.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return str(Path(file).resolve().parents[depth])


def _relative(path: Path, root: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(root) if path.is_relative_to(root) else path.name)


def _digest(files: list[Path], root: Path) -> str:
    """SHA-256 over each file's name (relative to the import root: a renamed file counts) and bytes."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(_relative(path, root).encode())
        digest.update(b"\0" + path.resolve().read_bytes() + b"\0")
    return digest.hexdigest()


def code_record(target: str) -> dict:
    """module, file, import_root, sources ({file under the import root: sha256}) and sha256 (over
    them all) of target."""
    module = import_module_of(target)
    file, covered = _source_files(module)
    root = Path(_import_root(module) or "/").resolve()
    sources = {_relative(path, root): hashlib.sha256(path.resolve().read_bytes()).hexdigest() for path in covered}
    return {"module": module.__name__, "file": str(file.resolve()) if file else None,
            "import_root": _import_root(module), "sources": sources, "sha256": _digest(covered, root)}


def file_changes(then: dict, now: dict) -> list[str]:
    """The files that differ between two records: 'a.py changed', 'b.py (new)', 'c.py (gone)'."""
    before, after = then["sources"], now["sources"]
    return ([f"{f} changed" for f in sorted(before.keys() & after.keys()) if before[f] != after[f]]
            + [f"{f} (new)" for f in sorted(after.keys() - before.keys())]
            + [f"{f} (gone)" for f in sorted(before.keys() - after.keys())])


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
        if "sources" in then:
            files = file_changes(then, now)
            if files:
                out.append(f"{target} ({', '.join(files)} under {then.get('import_root')}{moved})")
            continue
        # a record made before per-file hashes: the hash it took, over the files it covered
        module = import_module_of(target)
        legacy = _digest(_legacy_files(module), Path(_import_root(module) or "/").resolve())
        if legacy != then["sha256"]:
            out.append(f"{target} ({then['file']}: sha256 {then['sha256'][:12]} then, {legacy[:12]} now{moved})")
    return out


def restore_config_dirs(run: RunDir | Path) -> None:
    """Add the plugin config directories the run was composed with to this process's search path
    (a resume composes the run again), those that still exist."""

    saved = RunDir.of(run).provenance() or {}
    dirs = [url.removeprefix("file://") for url in saved.get("config_dirs", []) if url.startswith("file://")]
    add_config_dirs([d for d in dirs if Path(d).is_dir()])
