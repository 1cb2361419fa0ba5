"""`posenc benchmark`: run the benchmark protocol for one encoding and place it among the shipped
baselines; `--reproduce NAME` re-runs a shipped row and says whether it matched; `--regenerate`
measures every shipped encoding again and rewrites the shipped data and docs/leaderboard.md;
`--recheck` runs `posenc check` on every shipped encoding and rewrites only the rows' check records.
An encoding that fails `posenc check` is refused before any run (`--despite-check` places it, marked).

What may follow the command: the encoding (`encoding=NAME`) and its own keys (`encoding.KEY=…`,
`encoding@encoding.KEY=…`), and `--config-dir DIR` for an encoding kept outside posenc (as `posenc
train` takes it). Anything else would change the protocol, and the rows would no longer compare:
it is refused, as is shipped data measured under another protocol hash.
"""

from __future__ import annotations


import typer

from posenc.cli.common import console, run_guarded, user_wants_traceback, without_debug
from posenc.config.searchpath import SEARCH_ORDER
from posenc.errors import UserError


def encoding_overrides(args: list[str]) -> list[str]:
    """The overrides, checked to touch only the encoding: one error line for anything else."""
    from posenc.config import parse_overrides

    if not args:
        raise UserError("name the encoding to benchmark: `posenc benchmark encoding=NAME [encoding.KEY=…]` "
                        "(or --reproduce NAME, --regenerate)")
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise UserError(f"posenc benchmark does not take {flags[0]} — see `posenc benchmark --help`")
    parsed = parse_overrides(args)
    changing = [o.override.input_line for o in parsed
                if not (o.key == "encoding" or o.key.startswith(("encoding.", "encoding@")))]
    if changing:
        raise UserError(f"{changing[0]} would change the benchmark protocol, so the shipped rows would not compare — "
                        f"posenc benchmark takes only encoding=NAME and its encoding.KEY=… options "
                        f"(to study other settings, use `posenc train -m` and `posenc compare`)")
    if not any(o.key == "encoding" for o in parsed):
        raise UserError("name the encoding: `posenc benchmark encoding=NAME` (its options as encoding.KEY=…)")
    sweeps = [o.override.input_line for o in parsed if o.override.is_sweep_override()]
    if sweeps:
        raise UserError(f"{sweeps[0]}: posenc benchmark runs one encoding — run it once per value")
    return args


def label_of(args: list[str]) -> str:
    """The row's name: the encoding, with its options when any are given (`rope base=500`)."""
    from posenc.config import parse_overrides

    parsed = parse_overrides(args)
    name = next(str(v) for k, v, _ in parsed if k == "encoding")
    options = [f"{k.split('.', 1)[1] if k.startswith('encoding.') else k}={v}" for k, v, _ in parsed if k != "encoding"]
    return " ".join([name, *options])


def benchmark(
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
    protocol: str = typer.Option(None, "--protocol", help="the protocol (posenc/benchmark/<name>.yaml); "
                                 "default posenc-pe-v2 (posenc-pe-v1: its earlier version, kept readable)"),
    debug: bool = typer.Option(False, "--debug", help="show the full traceback on error"),
) -> None:
    """Run the benchmark protocol for one encoding and place it among the shipped baselines
    (after `posenc check`: an encoding that fails a property is refused).

    Example: `posenc benchmark encoding=mine --config-dir mine/conf`; `posenc benchmark --reproduce rope`.
    """
    from posenc.cli.benchmark_command import main

    modes = {"--reproduce": reproduce, "--regenerate": regenerate, "--write-docs": write_docs, "--recheck": recheck}
    run_guarded(lambda: main(without_debug(ctx.args), config_dir, modes, jobs, protocol, console, despite_check,
                             carry_from), debug or user_wants_traceback(ctx.args))


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(benchmark)
