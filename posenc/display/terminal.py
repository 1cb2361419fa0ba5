"""The consoles posenc prints through (rich), made in one place.

Without a terminal (output piped to a file, a SLURM log) rich falls back to 80 columns, so run-dir
paths and ``report.html`` break across lines (copying them fails) and table headers shrink to
``encodin…``. posenc's consoles are ``NO_TERMINAL_WIDTH`` wide there instead; ``COLUMNS``, where
set, wins in both cases.

Log records (Hydra's job logging, conf/hydra/job_logging/posenc.yaml) go through log_handler: rich's
handler in a terminal; without one, one plain line per record, never wrapped, since a log holds run
dirs and commands that a user copies whole.
"""

from __future__ import annotations

import logging
import os
import sys

from rich.console import Console
from rich.logging import RichHandler

#: columns used when the stream is not a terminal and COLUMNS is unset
NO_TERMINAL_WIDTH = 240


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width, COLUMNS, or NO_TERMINAL_WIDTH."""
    stream = sys.stderr if stderr else sys.stdout
    wide = "COLUMNS" not in os.environ and not (hasattr(stream, "isatty") and stream.isatty())
    return Console(stderr=stderr, width=NO_TERMINAL_WIDTH if wide else None)


def log_handler() -> logging.Handler:
    """The console's log handler (stdout): rich's in a terminal (coloured levels, wrapped to the
    window); without one ``INFO     message`` as one line, however long (rich would cut it at the
    console's width, putting a newline inside a path)."""
    if sys.stdout.isatty():
        handler: logging.Handler = RichHandler(console=make_console(), show_path=False, show_time=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))  # as rich's level column
    return handler
