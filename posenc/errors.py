"""What posenc tells a user. A mistake the user can fix is a ``UserError``: the CLI prints it as
one line, ``error: ...``, and exits 1. A choice posenc made for the user that they should know
of (a kernel that fell back, a component that could not be used) is a ``PosencWarning``, said
once per process and printed by the CLI as one line, ``warning: ...``."""

from __future__ import annotations

import warnings


class UserError(Exception):
    """A mistake the user can fix; its message says what to do instead."""

    exit_code: int = 1  # the process's exit status when this ends a command


class PosencWarning(RuntimeWarning):
    """Something posenc chose instead of what was asked or expected (a fallback), said once."""


_WARNED: set[str] = set()


def warn_once(message: str, stacklevel: int = 3) -> None:
    """One warning per distinct message per process, not one per forward or step."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, PosencWarning, stacklevel=stacklevel)


def show_as_lines() -> None:
    """Print posenc's own warnings as ``warning: <message>`` (the CLI's format); others as Python does."""
    if getattr(warnings.showwarning, "posenc", False):
        return
    python_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 - warnings' API
        if issubclass(category, PosencWarning):
            import sys

            print(f"warning: {message}", file=file or sys.stderr, flush=True)
        else:
            python_show(message, category, filename, lineno, file, line)

    show.posenc = True  # type: ignore[attr-defined]
    warnings.showwarning = show
