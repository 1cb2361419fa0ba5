"""Where configs come from: posenc's own conf/, then every plugin's config directory.

One mechanism, Hydra's config search path, seen by every command, in one order (SEARCH_ORDER):

1. posenc's own conf/ (shipped in the package as ``pkg://posenc.conf``);
2. the directories of ``POSENC_CONFIG_PATH`` (``os.pathsep``-separated, as PYTHONPATH), in order,
   which ``--config-dir DIR`` on any command prepends to for the command's process (so a sweep's
   jobs, a submitit launcher's included, inherit it as they inherit PYTHONPATH);
3. the config packages that installed distributions name in the ``posenc.plugins`` entry-point
   group (``mine = "myenc.conf"`` -> ``pkg://myenc.conf``), by entry-point name.

Each is a Hydra config directory: ``encoding/NAME.yaml`` with a ``_target_`` adds an encoding.
A file is taken from the first source that has it, so a plugin adds options but never replaces
posenc's own file of the same name, and a directory of yours comes before an installed plugin.
That is never silent: composing a config that chose a file more than one source holds prints one
``warning:`` line naming the file used and the ones it shadows (``warn_shadowed``), and
``posenc encodings`` says the same of every encoding. ``with_plugin_sources`` hands the plugins'
sources to Hydra as ``hydra.searchpath`` (Hydra's own key: after the primary config, before the
structured schema), an override every compose carries (``posenc train``'s runner and
``posenc.config.compose``, which every other command composes through); ``config_file`` and
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

from posenc.config.overrides import parse_overrides
from posenc.display.commands import hydra_value
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
#: the one search order, as docs/extending.md, docs/check.md and every --config-dir help state it
SEARCH_ORDER = ("posenc's own configs first, then --config-dir and POSENC_CONFIG_PATH's directories in order, then "
                "installed plug-ins (posenc.plugins entry points); the first file of a name is used, and a shadowed one "
                "is named in a warning")


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


#: Hydra's own key for config sources beyond the primary config (each placed, in order, after it and
#: before the structured schema): how the plugins' sources reach every Hydra compose, public API only
SEARCHPATH_KEY = "hydra.searchpath"


def with_plugin_sources(overrides: list[str]) -> list[str]:
    """overrides with the plugins' config sources on Hydra's search path, as the override
    ``hydra.searchpath=[...]`` (what `posenc train`'s runner, ``compose`` and Hydra's own app compose
    with). Hydra reads one such override, so a search path the overrides give already (the user's,
    or a resumed sweep's) is merged into it: the plugins' sources first, as Hydra puts its own
    ``--config-dir`` before ``hydra.searchpath``, then the given ones. No plugin source: the
    overrides as they are.

    A source that is not there (an entry point's package removed since) is left out, so composing
    never warns about it; ``posenc encodings`` lists what each source holds."""

    ours = [url for url in plugin_sources() if _available(url)]
    if not ours:
        return list(overrides)
    given = [o for o in parse_overrides([o for o in overrides if SEARCHPATH_KEY in o]) if o.key == SEARCHPATH_KEY]
    kept = [str(url) for o in given for url in (o.value or [])]
    urls = [*ours, *(url for url in kept if url not in ours)]
    rest = [o for o in overrides if o not in {g.override.input_line for g in given}]
    return [*rest, f"{SEARCHPATH_KEY}=[{','.join(hydra_value(url) for url in urls)}]"]


def _available(url: str) -> bool:
    root = _root(url)
    return root is not None and root.is_dir()


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


def sources_of(group: str, name: str) -> list[str]:
    """Every search-path URL that holds group/name.yaml, in search order (the first is used)."""
    out = []
    for url in sources():
        root = _root(url)
        if root is not None and root.joinpath(group).joinpath(f"{name}.yaml").is_file():
            out.append(url)
    return out


def source_of(group: str, name: str) -> str | None:
    """The search-path URL whose group/name.yaml is used (posenc's own first), or None."""
    found = sources_of(group, name)
    return found[0] if found else None


def describe_source(url: str) -> str:
    """A source as a user knows it: posenc's own configs, a directory, an installed plug-in."""
    scheme, _, where = url.partition("://")
    if url == CONFIG_PATH:
        return "posenc's own configs"
    return f"the installed plug-in {where}" if scheme == "pkg" else where


def shadow_line(group: str, name: str, holders: list[str]) -> str:
    """One line: which source's group/name.yaml ``group=name`` uses, and which it shadows."""
    others = " and ".join(describe_source(u) for u in holders[1:])
    return (f"warning: {group}={name} uses {group}/{name}.yaml from {describe_source(holders[0])}; the one in "
            f"{others} is shadowed (search order: posenc's own, then --config-dir and POSENC_CONFIG_PATH, then "
            f"installed plug-ins) — give it another name to use it")


def shadowed_options(group: str) -> list[tuple[str, list[str]]]:
    """(name, the sources holding group/name.yaml, in search order) for every option of a group
    that more than one source holds."""
    found = [(name, sources_of(group, name)) for name in group_options(group)]
    return [(name, holders) for name, holders in found if len(holders) > 1]


_WARNED: set[tuple[str, ...]] = set()


def warn_shadowed(choices) -> None:
    """One ``warning:`` line on stderr, once per process, for each config file a compose chose
    (Hydra's ``hydra.runtime.choices``: group -> name) that more than one source holds."""
    for key, name in dict(choices or {}).items():
        group = str(key).partition("@")[0]
        if not isinstance(name, str) or group.startswith("hydra"):
            continue
        holders = sources_of(group, name)
        if len(holders) > 1 and (group, name, *holders) not in _WARNED:
            _WARNED.add((group, name, *holders))
            print(shadow_line(group, name, holders), file=sys.stderr)
