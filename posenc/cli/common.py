"""What every command shares: the consoles, the one-line error, and the guard that makes one.

A mistake a user can make prints one line, ``error: ...``, and exits 1; ``--debug`` or
``HYDRA_FULL_ERROR=1`` shows the full traceback instead. A stop the user asked for (Ctrl-C,
SIGTERM) is no error: its line reads ``interrupted: ...`` and it exits 130 or 143, as shells expect.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import typer
from rich.markup import escape

from posenc.cli.explain import explain
from posenc.display.terminal import make_console

console = make_console()
err_console = make_console(stderr=True)

#: a command whose arguments Typer passes through untouched, to Hydra's own parser
HYDRA_ARGS = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True,
                                   "help_option_names": []}}
DEBUG_FLAG = "--debug"

T = TypeVar("T")


def user_wants_traceback(args: list[str]) -> bool:
    return DEBUG_FLAG in args or os.environ.get("HYDRA_FULL_ERROR") == "1"


def without_debug(args: list[str]) -> list[str]:
    return [a for a in args if a != DEBUG_FLAG]


#: exit codes of a stop the user asked for: 128 + SIGINT (Ctrl-C), 128 + SIGTERM
INTERRUPTED = (130, 143)


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr, `error: …` (`interrupted: …` for an exit code of INTERRUPTED), and exit with code."""
    label = "[bold yellow]interrupted:[/]" if code in INTERRUPTED else "[bold red]error:[/]"
    # escape: a message may quote the user's `[a,b]` lists, which rich would read as markup
    err_console.print(f"{label} {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def run_guarded(func: Callable[[], T], debug: bool) -> T:
    """func(), with any exception turned into one `error:` line (unless debug)."""

    try:
        return func()
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        fail("stopped by Ctrl-C", code=130)
    except Exception as e:  # noqa: BLE001 - every exception becomes one line unless --debug
        if debug:
            raise
        fail(explain(e), code=getattr(e, "exit_code", 1))
