"""The installed package is whole: what `pip install .` (not editable) puts on a machine holds every
module and every config of the source tree, and `posenc check` runs from it.

pyproject.toml lists its packages by hand: the top-level conf/ ships as `posenc.conf` through a
package-dir mapping, and setuptools' `packages.find` names a package by its folder under `where`
(conf/encoding would be `encoding`, never `posenc.conf.encoding`), while pyproject takes either a
list or a find directive, not both. So the list is held against the tree here, and a wheel built
from a copy of the tree is opened and installed (`posenc.check` was once missing from the
list, and `posenc check` failed after `pip install .`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a wheel built and installed into a virtual environment of its own

ROOT = Path(__file__).resolve().parents[1]
#: what the build needs from the tree: metadata, the readme it names, the two package roots
SOURCES = ("pyproject.toml", "README.md", "posenc", "conf")
#: never shipped: bytecode, and the marker that keeps an empty folder in git
SKIPPED = ("__pycache__", "*.pyc", ".gitkeep", "*.egg-info")


def shipped_files() -> dict[str, Path]:
    """Every file the wheel must hold, by its path inside the wheel: posenc/** as is, conf/** as
    posenc/conf/** (modules, YAML, the benchmark's baselines: every file, not only .py)."""
    out = {}
    for top, inside in (("posenc", "posenc"), ("conf", "posenc/conf")):
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT / top)
            if path.is_file() and not any(rel.match(p) or any(part == p for part in rel.parts) for p in SKIPPED):
                out[f"{inside}/{rel.as_posix()}"] = path
    return out


def test_the_package_list_is_the_tree():
    """pyproject's packages are exactly the folders that hold files under posenc/ (modules, or data
    such as the leaderboard's baselines: setuptools warns of an unlisted folder) and the folders
    of conf/ (as posenc.conf.*): a new subpackage or config group that is not listed, or a listed
    one that no longer exists, fails here before any wheel is built."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    modules = {"/".join(Path(name).parent.parts) for name in shipped_files() if not name.startswith("posenc/conf/")}
    config_folders = {"posenc/conf/" + p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*")
                      if p.is_dir() and p.name != "__pycache__"}
    tree = {folder.replace("/", ".") for folder in modules | config_folders | {"posenc/conf"}}
    assert listed == tree, {"not listed": sorted(tree - listed), "listed, not in the tree": sorted(listed - tree)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tree, offline: the build backend of this environment
    (setuptools, from the `test` extra) instead of an isolated one fetched from an index."""
    pytest.importorskip("setuptools", minversion="77")  # pyproject's SPDX `license` string
    tmp = tmp_path_factory.mktemp("wheel")
    (tmp / "src").mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp / "src" / name, ignore=shutil.ignore_patterns(*SKIPPED))
        else:
            shutil.copy2(src, tmp / "src" / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(tmp / "dist"), str(tmp / "src")],
                           check=False, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-3000:]
    [built] = (tmp / "dist").glob("posenc-*.whl")
    return built


def test_the_wheel_holds_every_module_and_data_file_of_the_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(set(shipped_files()) - names)
    assert not missing, missing
    assert "posenc/check/cuda.py" in names and "posenc/conf/config.yaml" in names


def test_posenc_check_runs_from_the_installed_wheel(wheel, tmp_path):
    """Installed with pip into a folder of its own and run from outside the repository (so the
    installed copy, not the source tree, is the one imported): the console script's `posenc check`
    imports posenc.check, composes through pkg://posenc.conf and every property holds."""
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                              "--target", str(site), str(wheel)],
                             check=False, capture_output=True, text=True, timeout=120)
    assert install.returncode == 0, install.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    code = "from importlib.util import find_spec as f; print(f('posenc.check').origin, f('posenc.conf').origin)"
    where = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(site) for line in where.stdout.split()), where.stdout
    check = subprocess.run([str(site / "bin" / "posenc"), "check", "encoding=nope"], check=False, cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert "properties hold" in check.stdout
