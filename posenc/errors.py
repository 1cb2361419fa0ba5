"""Errors a user can cause. The CLI prints them as one line, ``error: ...``, and exits 1."""


class UserError(Exception):
    """A mistake the user can fix; its message says what to do instead."""

    exit_code: int = 1  # the process's exit status when this ends a command
