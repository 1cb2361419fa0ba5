"""Commands posenc prints for people to paste: whole on one line, quoted for the shell and, inside
it, for Hydra's override grammar.

A run's or sweep's folder holds characters both read: a sweep's name keeps its swept values
(``encoding-rope,alibi``: a ',' is a sweep to Hydra) and a job's folder its own (``0_encoding=rope``:
Hydra cannot parse a second '='). So a path in an override is put in Hydra's single quotes
(hydra_value), and the whole override in the shell's quotes (shell_word):
``"trainer.resume='outputs/sweeps/…_encoding-rope,alibi/0_encoding=rope'"``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

#: what Hydra reads as a plain string value and the shell as one plain word: no quoting needed
_PLAIN = re.compile(r"[A-Za-z0-9_./+:@%-]+")
#: what Hydra would read as a number, a bool or null rather than a string
_TYPED = re.compile(r"[-+]?[0-9.].*|(?i:true|false|null|none|[-+]?inf|nan)")
#: what keeps its meaning inside the shell's double quotes (no $ ` \ " or ! history expansion)
_DOUBLE_QUOTABLE = re.compile(r'[^$`\\"!]*')


def hydra_value(value: str | Path) -> str:
    """value as an override's value that Hydra reads back as this very string: plain where it
    can be, else in Hydra's single quotes, where a quote is escaped by a backslash and
    backslashes are doubled only where they come before a quote or the closing one."""
    text = str(value)
    if _PLAIN.fullmatch(text) and not _TYPED.fullmatch(text):
        return text
    escaped = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text)
    return f"'{escaped}'"


def shell_word(word: str) -> str:
    """word as one shell word: bare where nothing in it is special, in double quotes where that is
    enough (it reads better around Hydra's single quotes), else shlex.quote's single quotes."""
    if _PLAIN.fullmatch(word.replace("=", "").replace(",", "")) and word:
        return word
    if _DOUBLE_QUOTABLE.fullmatch(word):
        return f'"{word}"'
    return shlex.quote(word)


def override(key: str, value: str | Path) -> str:
    """``key=value`` as one shell word that Hydra reads as key set to the string value."""
    return shell_word(f"{key}={hydra_value(value)}")


def command(*words: str) -> str:
    """A command line from words already quoted (override, shell_word), on one line."""
    return " ".join(words)
