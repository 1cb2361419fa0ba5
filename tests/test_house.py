"""The house's direction over every module of posenc/: imports point down the layers and never in a
circle (pyproject's import-linter contracts). How long a module or a function may grow is a review
hint, not a test (docs/architecture.md, "Reading the code")."""

from __future__ import annotations

import inspect
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "posenc"


def test_imports_point_down_the_layers_and_never_in_a_circle(capsys) -> None:
    """pyproject's [tool.importlinter] contracts (docs/architecture.md, "Layers"): commands above the
    leaderboard, the checks and the bench, training, evaluation, reports, run directories, config,
    the model and the data; no package or module imports one that imports it back."""
    from importlinter.cli import (  # configures import-linter on import
        EXIT_STATUS_SUCCESS,
        lint_imports,
    )

    quiet = {"no_logo": True} if "no_logo" in inspect.signature(lint_imports).parameters else {}  # 2.7 on (rich >= 14.2)
    status = lint_imports(config_filename=str(PACKAGE.parent / "pyproject.toml"), no_cache=True, **quiet)
    assert status == EXIT_STATUS_SUCCESS, capsys.readouterr().out[-3000:]


def test_the_import_graph_sees_imports_inside_functions() -> None:
    """The contracts hold function-level imports to the layers too: the graph has cli/benchmark.py's
    import of benchmark_command, made inside the command so that the CLI starts fast."""
    import grimp

    graph = grimp.build_graph("posenc", exclude_type_checking_imports=True)
    assert "posenc.cli.leaderboard_command" in graph.find_modules_directly_imported_by("posenc.cli.leaderboard")
