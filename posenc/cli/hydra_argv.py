"""`posenc train`'s command line as Hydra reads it: Hydra's flags, then its overrides.

Typer owns the command word; everything after it is Hydra's command line, the flags that
`posenc train --hydra-help` lists. posenc reads that line before Hydra does, to settle what Hydra
cannot (a resume's run dir, torchrun's, a sweep's name: posenc/cli/launch.py), so it must know which
words are flags, and which flags take a value. Hydra builds its parser in a private module, not its
API, so the flags are written here as Hydra documents them, with the same names, values and
defaults, and tests/test_hydra_flags.py holds this list equal to the one Hydra's own `--hydra-help`
prints: a Hydra release that adds, drops or renames a flag fails there.

The flags that only show something (``SHOWS``: --help, --cfg, --info, ...) are handed back to Hydra's
own app, written out again by ``command_line``.
"""

from __future__ import annotations

import argparse

from posenc.errors import UserError

#: what --info can print, as Hydra names it
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
#: Hydra's flags, in its --hydra-help's order: (names, how argparse reads it); the first name is
#: the one posenc writes back (command_line), the argparse attribute is the first without dashes
FLAGS: tuple[tuple[tuple[str, ...], dict], ...] = (
    (("--help", "-h"), {"action": "store_true"}),
    (("--hydra-help",), {"action": "store_true"}),
    (("--version",), {"action": "store_true"}),
    (("--cfg", "-c"), {"choices": ("job", "hydra", "all")}),
    (("--resolve",), {"action": "store_true"}),
    (("--package", "-p"), {}),
    (("--run", "-r"), {"action": "store_true"}),
    (("--multirun", "-m"), {"action": "store_true"}),
    (("--shell-completion", "-sc"), {"action": "store_true"}),
    (("--config-path", "-cp"), {}),
    (("--config-name", "-cn"), {}),
    (("--config-dir", "-cd"), {}),
    (("--experimental-rerun",), {}),
    (("--info", "-i"), {"nargs": "?", "const": "all", "choices": INFO_TOPICS}),
)
#: the flags that show something and run nothing (Hydra's own app prints it)
SHOWS = ("help", "hydra_help", "version", "cfg", "info", "shell_completion")
#: the flags posenc settles itself and never hands on: its search path (posenc/config/searchpath.py)
#: and a rerun it refuses
NOT_HANDED_ON = ("config_dir", "experimental_rerun")


def dest(names: tuple[str, ...]) -> str:
    return names[0].lstrip("-").replace("-", "_")


def hydra_parser() -> argparse.ArgumentParser:
    """Hydra's command line; a flag it does not know is a UserError, not argparse's usage text and
    exit 2."""
    parser = argparse.ArgumentParser(prog="posenc train", add_help=False)
    parser.add_argument("overrides", nargs="*")
    for names, how in FLAGS:
        parser.add_argument(*names, dest=dest(names), **how)

    def refuse(message: str) -> None:
        raise UserError(f"{message} — see `posenc train --help`")

    parser.error = refuse  # type: ignore[method-assign]
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """argv as Hydra reads it: its flags apart, the overrides in .overrides (`-m` may come
    after the overrides, as users type it)."""
    return hydra_parser().parse_intermixed_args(argv)


def shows(args: argparse.Namespace) -> bool:
    """Whether the command line asks Hydra to show something rather than run."""
    return any(getattr(args, name) not in (None, False) for name in SHOWS)


def command_line(args: argparse.Namespace) -> list[str]:
    """args written back as a command line for Hydra's own app: its flags (posenc's own settled),
    then the overrides."""
    words: list[str] = []
    for names, how in FLAGS:
        value = getattr(args, dest(names))
        if dest(names) in NOT_HANDED_ON or value in (None, False):
            continue
        words += [names[0]] if how.get("action") == "store_true" else [names[0], str(value)]
    return [*words, *args.overrides]
