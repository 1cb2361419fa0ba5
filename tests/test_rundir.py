"""One RunDir owns a run directory's layout (posenc/record/rundir.py): no other module of posenc spells
a run directory's file names, so a file moved or renamed is changed in one place, and a command
reads each file of a run once."""

from __future__ import annotations

import ast
from pathlib import Path

import posenc
from posenc.record import rundir

PACKAGE = Path(posenc.__file__).parent
OWNER = Path(rundir.__file__)
#: names that appear only inside run directories: spelled anywhere in a string, they name a run's file
FILE_NAMES = (rundir.HYDRA_DIR, rundir.CONFIG_FILE, rundir.OVERRIDES_FILE, rundir.HYDRA_FILE, rundir.METRICS_FILE,
              rundir.SUMMARY_FILE, rundir.PROVENANCE_FILE, rundir.PARENT_FILE, rundir.PROBES_FILE,
              rundir.MULTIRUN_FILE, rundir.SWEEP_FILE, rundir.eval_file_name(), f"{rundir.CHECKPOINTS_DIR}/",
              f"last{rundir.CHECKPOINT_SUFFIX}", f"best{rundir.CHECKPOINT_SUFFIX}",
              f"last{rundir.LEGACY_SUFFIX}", f"best{rundir.LEGACY_SUFFIX}")
#: plain words that name a run's folder or file stem only when a string is the word itself, or a file
#: named after it ("probes" alone, "per_position_eval"), not a sentence or a W&B key ("per_position/loss")
STEMS = (rundir.CHECKPOINTS_DIR, rundir.PROBES_DIR, rundir.PER_POSITION_STEM)


def _docstrings(tree: ast.AST) -> set[int]:
    """The string expressions that document (a module's, class's or function's docstring, a
    constant's string below it): prose may name files, code may not."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _spells_a_run_file(text: str) -> bool:
    return any(name in text for name in FILE_NAMES) or \
        any(text == stem or text.startswith((f"{stem}_", f"{stem}.")) for stem in STEMS)


def run_file_names_in(path: Path) -> list[tuple[int, str]]:
    """(line, string) of each string in path's code (f-strings' literal parts included) that spells
    one of a run directory's file names."""
    tree = ast.parse(path.read_text())
    prose = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            and _spells_a_run_file(node.value)]


def test_only_rundir_spells_a_run_directorys_file_names():
    found = {str(path.relative_to(PACKAGE)): hits for path in sorted(PACKAGE.rglob("*.py"))
             if path != OWNER and (hits := run_file_names_in(path))}
    assert found == {}, f"take these paths from RunDir (posenc/record/rundir.py): {found}"
    # the scan sees what it looks for: it finds each of the owner's own names where it is defined
    defined = {rundir.HYDRA_DIR, rundir.CONFIG_FILE, rundir.OVERRIDES_FILE, rundir.HYDRA_FILE, rundir.METRICS_FILE,
               rundir.SUMMARY_FILE, rundir.PROVENANCE_FILE, rundir.PARENT_FILE, rundir.PROBES_FILE,
               rundir.MULTIRUN_FILE, rundir.SWEEP_FILE, *STEMS}
    assert defined <= {text for _, text in run_file_names_in(OWNER)}


def test_a_run_is_named_by_what_tells_it_apart_from_its_sweeps_other_runs(tmp_path: Path):
    """Issue 53: a sweep job's per-position figure was titled 'rope: per-position loss', whichever base it
    had. RunDir.varied gives the figures (per_position.png's title) the job's own swept values, as in its
    directory's name; a single run's, the encoding options its command line set."""
    import yaml

    def run(path: Path, mode: str, task: list[str], exclude: list[str]) -> rundir.RunDir:
        (path / ".hydra").mkdir(parents=True)
        hydra = {"hydra": {"mode": mode, "overrides": {"task": task},
                           "job": {"config": {"override_dirname": {"exclude_keys": exclude}}}}}
        (path / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
        (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(task))
        return rundir.RunDir(path)

    sweep = tmp_path / "sweeps" / "10-00-00-000000_base-500,10000_seed-0,1"
    sweep.mkdir(parents=True)
    (sweep / rundir.MULTIRUN_FILE).write_text("hydra: {}\n")
    job = run(sweep / "1_base=500_seed=1", "MULTIRUN",
              ["encoding=rope", "encoding.base=500", "model=micro", "seed=1", "name='base-500,10000_seed-0,1'"],
              ["encoding", "model", "name"])
    assert job.varied() == ["base=500", "seed=1"]
    single = run(tmp_path / "10-00-00-000000_rope", "RUN", ["encoding.base=500", "model=micro", "logger=none"], [])
    assert single.varied() == ["base=500"]
