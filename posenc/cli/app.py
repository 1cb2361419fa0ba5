"""The `posenc` command. Typer owns the command words; Hydra owns everything after them.

Each command (or family) lives in its own module and registers itself here; the shared
consoles and the one-line error are in common.py. Nothing imports app.py but the entry point.
"""

from __future__ import annotations

import click
import typer
from typer.core import TyperGroup

from posenc.cli.catalogue import register as add_catalogue
from posenc.cli.check import register as add_check
from posenc.cli.generate import register as add_generate
from posenc.cli.hydra_commands import register as add_hydra_commands
from posenc.cli.leaderboard import register as add_leaderboard
from posenc.cli.plot import plot_app
from posenc.cli.runs import register as add_runs
from posenc.errors import show_as_lines

show_as_lines()  # posenc's own warnings (a kernel that fell back, …) as one `warning: …` line each
from posenc.cli.common import fail
from posenc.config.searchpath import SEARCH_ORDER, take_config_dirs
from posenc.errors import UserError


class PluginSearchPath(TyperGroup):
    """Every command takes ``--config-dir DIR`` (Hydra's flag; repeatable), wherever it stands: it
    is taken off the arguments here, once for all commands, and added to the config search path
    (posenc/config/searchpath.py) that every command composes with."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:

        try:
            args = take_config_dirs(args)
        except UserError as e:
            fail(str(e))
        untyped_flags(self, ctx)
        return super().parse_args(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            untyped_flags(command, ctx)
        return command


def untyped_flags(command: click.Command, ctx: click.Context) -> None:
    """A flag takes no value, so its help shows none: Typer (0.29) prints every option's type, a
    flag's too (`--help <bool>`, `--seeds <bool>`), which reads as if it wanted `--help true`. An
    empty metavar is Typer's own way to show no type (click caches the help option, so it sticks)."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():  # a group's own commands (posenc plot …)
        untyped_flags(sub, ctx)


app = typer.Typer(
    cls=PluginSearchPath,
    add_completion=False,
    no_args_is_help=True,
    help="posenc: which positional encoding should a transformer LM use, and why?\n\n"
    "Trains small decoder-only transformers that differ only in their positional encoding "
    "and compares them on perplexity, convergence and length extrapolation.\n\n"
    "Every command takes --config-dir DIR (or POSENC_CONFIG_PATH=DIR1:DIR2): config directories "
    "whose encoding/NAME.yaml add encodings kept outside posenc (docs/extending.md). Search order: "
    f"{SEARCH_ORDER}.",
)
add_hydra_commands(app)        # train, bench
add_runs(app)                  # eval, probe, compare, convert
add_catalogue(app)             # encodings
add_check(app)                 # check: the encoding contract as properties
add_generate(app)              # generate: text from a trained run, decoded with a KV cache
add_leaderboard(app)           # leaderboard: the protocol, the shipped baselines (alias: benchmark)
app.add_typer(plot_app, name="plot")  # plot decay | extrapolation


def main() -> None:
    app()


if __name__ == "__main__":
    main()
