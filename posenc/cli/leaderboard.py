"""`posenc leaderboard`: bare, the shipped table (`--metric` for one column); with an encoding, run the
benchmark protocol for it and place it among the shipped baselines; `--reproduce NAME` re-runs a shipped row and says whether it matched; `--regenerate`
measures every shipped encoding again and rewrites the shipped data and docs/leaderboard.md;
`--recheck` runs `posenc check` on every shipped encoding and rewrites only the rows' check records.
An encoding that fails `posenc check` is refused before any run (`--despite-check` places it, marked).

What may follow the command: the encoding (`encoding=NAME`) and its own keys (`encoding.KEY=…`,
`encoding@encoding.KEY=…`), and `--config-dir DIR` for an encoding kept outside posenc (as `posenc
train` takes it). Anything else would change the protocol, and the rows would no longer compare:
it is refused, as is shipped data measured under another protocol hash.
"""

from __future__ import annotations

import functools

import typer

from posenc.cli.common import (
    console,
    err_console,
    fail,
    run_guarded,
    user_wants_traceback,
    without_debug,
)
from posenc.config.searchpath import SEARCH_ORDER


def leaderboard(
    ctx: typer.Context,
    config_dir: str = typer.Option(None, "--config-dir", help="a directory of your own configs (an encoding kept "
                                   f"outside posenc: DIR/encoding/NAME.yaml), as every command takes it; {SEARCH_ORDER}"),
    reproduce: str = typer.Option(None, "--reproduce", help="re-run this shipped encoding and say whether every "
                                  "seed matched the shipped values (within the protocol's tolerance)"),
    regenerate: bool = typer.Option(False, "--regenerate", help="measure every shipped encoding again; rewrite "
                                    "the shipped data and docs/leaderboard.md"),
    write_docs: bool = typer.Option(False, "--write-docs", help="only render docs/leaderboard.md from the shipped data"),
    recheck: bool = typer.Option(False, "--recheck", help="run `posenc check` on every shipped encoding again; rewrite "
                                 "the shipped rows' check records and docs/leaderboard.md (seconds, no runs)"),
    despite_check: bool = typer.Option(False, "--despite-check", help="place an encoding that fails `posenc check`, "
                                       "marked as failing (without it, such an encoding is refused before any run)"),
    jobs: int = typer.Option(1, "--jobs", min=1, help="with --regenerate: sweeps run side by side (one core each)"),
    carry_from: str = typer.Option(None, "--carry-from", help="with --regenerate: take this earlier protocol's "
                                   "shipped rows instead of measuring them, where it ran the same arms and seeds"),
    metric: str = typer.Option(None, "--metric", help="with nothing else: the shipped table for this metric alone, "
                               "sorted by it (its key, extrapolation/ppl@1024, or its column, 'ppl 16×' or ppl@16x)"),
    protocol: str = typer.Option(None, "--protocol", help="the protocol (posenc/leaderboard/<name>.yaml); "
                                 "default posenc-pe-v2 (posenc-pe-v1: its earlier version, kept readable)"),
    debug: bool = typer.Option(False, "--debug", help="show the full traceback on error"),
) -> None:
    """The shipped leaderboard (bare, or --metric for one column); with encoding=NAME, run its
    protocol for that encoding and place it among the shipped rows (after `posenc check`: an
    encoding that fails a property is refused).

    Example: `posenc leaderboard`; `posenc leaderboard --metric extrapolation/ppl@16x`;
    `posenc leaderboard encoding=mine --config-dir mine/conf`; `posenc leaderboard --reproduce rope`.
    """
    modes = {"--reproduce": reproduce, "--regenerate": regenerate, "--write-docs": write_docs, "--recheck": recheck}
    args, traceback = without_debug(ctx.args), debug or user_wants_traceback(ctx.args)
    if not (args or any(modes.values()) or config_dir or despite_check or carry_from):  # nothing to run: the table
        from posenc.cli.leaderboard_table import show_shipped  # start-up: no torch to print shipped numbers

        return run_guarded(lambda: show_shipped(protocol, metric, console), traceback)
    if metric is not None:
        fail("--metric filters the shipped table that a bare `posenc leaderboard` prints — give it alone "
             "(`posenc leaderboard --metric extrapolation/ppl@1024`)")
    from posenc.cli.leaderboard_command import main  # start-up: the leaderboard's modules load when it runs

    run_guarded(lambda: main(args, config_dir, modes, jobs, protocol, console, despite_check, carry_from), traceback)


def register(app: typer.Typer) -> None:
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("leaderboard", context_settings=settings)(leaderboard)
    app.command("benchmark", context_settings=settings, hidden=True)(old_name(leaderboard))


def old_name(command):
    """``posenc benchmark``, the command's name until this release (beside `posenc bench`, the speed
    bench, it read as the same thing): kept for a release, hidden from the list, saying its new name."""

    @functools.wraps(command)  # the same options: typer reads the signature through __wrapped__
    def alias(*args, **kwargs):
        err_console.print("warning: `posenc benchmark` is now `posenc leaderboard`; the old name goes in a later "
                          "release", highlight=False, soft_wrap=True)
        return command(*args, **kwargs)

    return alias
