"""The consoles posenc prints through (rich), made in one place.

Without a terminal (output piped to a file, a SLURM log) rich falls back to 80 columns, so run-dir
paths and ``report.html`` break across lines (copying them fails) and table headers shrink to
``encodin…``. posenc's consoles are ``NO_TERMINAL_WIDTH`` wide there instead; ``COLUMNS``, where
set, wins in both cases.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

#: columns used when the stream is not a terminal and COLUMNS is unset
NO_TERMINAL_WIDTH = 240


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width, COLUMNS, or NO_TERMINAL_WIDTH."""
    stream = sys.stderr if stderr else sys.stdout
    wide = "COLUMNS" not in os.environ and not (hasattr(stream, "isatty") and stream.isatty())
    return Console(stderr=stderr, width=NO_TERMINAL_WIDTH if wide else None)
