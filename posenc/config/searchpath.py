"""Where configs come from: posenc's own conf/, then every plugin's config directory.

One mechanism, Hydra's config search path, seen by every command. posenc's conf/ (shipped in
the package as ``pkg://posenc.conf``) comes first; after it, in order:

- the directories of ``POSENC_CONFIG_PATH`` (``os.pathsep``-separated, as PYTHONPATH), which
  ``--config-dir DIR`` on any command prepends to for the command's process (so a sweep's jobs,
  a submitit launcher's included, inherit it as they inherit PYTHONPATH);
- the config packages that installed distributions name in the ``posenc.plugins`` entry-point
  group (``mine = "myenc.conf"`` -> ``pkg://myenc.conf``).

Each is a Hydra config directory: ``encoding/NAME.yaml`` with a ``_target_`` adds an encoding.
As with Hydra's own ``--config-dir``, a plugin adds options but never shadows posenc's own file
of the same name. ``config_search_path`` is what Hydra composes with (``posenc train``'s runner
and ``posenc.config.compose``, which every other command composes through); ``config_file`` and
``group_options`` read the same sources for listings (``posenc encodings``, ``posenc bench``).
"""

from __future__ import annotations

import functools
import os
import sys
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from posenc.errors import UserError

if TYPE_CHECKING:
    from importlib.abc import Traversable

#: the top-level conf/ directory, shipped inside the package as posenc.conf
CONFIG_MODULE = "posenc.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
#: plugin config directories, os.pathsep-separated (as PYTHONPATH)
ENV_VAR = "POSENC_CONFIG_PATH"
#: entry points whose value names a config package of an installed plugin
ENTRY_POINT_GROUP = "posenc.plugins"
#: the flag every command takes (Hydra's own name for it), and its short form
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def add_config_dirs(dirs: list[str | Path]) -> None:
    """``--config-dir DIR``: put DIR first in POSENC_CONFIG_PATH for this process and the ones it
    starts. A directory that does not exist is refused (a typo would otherwise hide the plugin)."""
    resolved = []
    for d in dirs:
        path = Path(d).expanduser().resolve()
        if not path.is_dir():
            raise UserError(f"--config-dir '{d}' does not exist — pass a directory of YAML configs "
                            f"(one holding encoding/NAME.yaml)")
        resolved.append(str(path))
    kept = [d for d in env_config_dirs() if d not in resolved]
    if resolved or kept:  # absolute: a job that starts in another directory finds the same dirs
        os.environ[ENV_VAR] = os.pathsep.join([*resolved, *kept])


def take_config_dirs(args: list[str]) -> list[str]:
    """args without its ``--config-dir DIR`` / ``--config-dir=DIR`` / ``-cd DIR`` flags, which are
    added to the search path (add_config_dirs)."""
    rest, dirs, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a in CONFIG_DIR_FLAGS:
            if i + 1 == len(args):
                raise UserError(f"{a} needs a directory — e.g. {a} mine/conf")
            dirs.append(args[i + 1])
            i += 2
            continue
        if a.startswith("--config-dir="):
            dirs.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    add_config_dirs(dirs)
    return rest


def env_config_dirs() -> list[str]:
    """The directories of POSENC_CONFIG_PATH, absolute, in order, empty entries skipped."""
    raw = os.environ.get(ENV_VAR, "")
    return [str(Path(d).expanduser().resolve()) for d in raw.split(os.pathsep) if d.strip()]


def plugin_sources() -> list[str]:
    """Hydra search-path URLs of every plugin, in priority order: POSENC_CONFIG_PATH's
    directories (file://), then the entry points' config packages (pkg://)."""
    urls = [f"file://{d}" for d in env_config_dirs()]
    urls += [f"pkg://{package}" for package in _entry_point_packages(_import_path_state())]
    return list(dict.fromkeys(urls))


def _import_path_state() -> tuple[tuple[str, int | None], ...]:
    """Each sys.path entry (absolute) with its modification time: what installing or removing a
    distribution changes, as importlib's own path finders notice a changed directory."""
    state = []
    for entry in sys.path:
        where = os.path.abspath(entry or os.curdir)
        try:
            state.append((where, os.stat(where).st_mtime_ns))
        except OSError:
            state.append((where, None))
    return tuple(state)


@functools.lru_cache(maxsize=8)
def _entry_point_packages(path_state: tuple[tuple[str, int | None], ...]) -> tuple[str, ...]:
    """The config packages the installed plugins name, by entry-point name. Cached per import
    path state: reading every distribution's metadata takes ~15 ms, and a compose asks twice."""
    return tuple(ep.value for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name))


def sources() -> list[str]:
    """posenc's own conf/, then the plugins: the order in which a config file is looked up."""
    return [CONFIG_PATH, *plugin_sources()]


def config_search_path(primary: str | None = None):
    """Hydra's ConfigSearchPath for composing posenc's config: Hydra's own, conf/ (or primary,
    `posenc train --config-path`), the plugins, then the structured schema, as Hydra's own
    ``--config-dir`` would place them."""
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_automatic_config_search_path(None, None, primary or CONFIG_PATH)
    for url in plugin_sources():  # each inserted just before the schema: they keep their order
        search_path.prepend(provider="posenc-plugin", path=url, anchor=SearchPathQuery(provider="schema"))
    return search_path


def _root(url: str) -> Traversable | None:
    scheme, _, where = url.partition("://")
    if scheme == "file":
        return Path(where)
    try:
        return files(where)
    except (ModuleNotFoundError, TypeError):  # an entry point naming a package that is gone
        return None


def config_file(relative: str) -> Traversable | None:
    """The first source's file at relative ('encoding/rope.yaml'), or None."""
    for url in sources():
        path = _root(url)
        if path is None:
            continue
        for part in relative.split("/"):  # one part at a time: Traversable.joinpath takes one before 3.11
            path = path.joinpath(part)
        if path.is_file():
            return path
    return None


def group_options(group: str) -> list[str]:
    """Every source's options of a config group, sorted: group_options('encoding') -> ['alibi', ...]."""
    names: set[str] = set()
    for url in sources():
        root = _root(url)
        directory = root.joinpath(group) if root is not None else None
        if directory is not None and directory.is_dir():
            names.update(p.name[: -len(".yaml")] for p in directory.iterdir() if p.name.endswith(".yaml"))
    return sorted(names)


def source_of(group: str, name: str) -> str | None:
    """The search-path URL that holds group/name.yaml (posenc's own first), or None."""
    for url in sources():
        root = _root(url)
        if root is not None and root.joinpath(group).joinpath(f"{name}.yaml").is_file():
            return url
    return None
