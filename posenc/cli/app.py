"""The `posenc` command. Typer owns the command words; Hydra owns everything after them.

Each command (or family) lives in its own module and registers itself here; the shared
consoles and the one-line error are in common.py. Nothing imports app.py but the entry point.
"""

from __future__ import annotations

import typer

from posenc.cli.benchmark import register as add_benchmark
from posenc.cli.catalogue import register as add_catalogue
from posenc.cli.check import register as add_check
from posenc.cli.hydra_commands import register as add_hydra_commands
from posenc.cli.plot import plot_app
from posenc.cli.runs import register as add_runs

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="posenc: which positional encoding should a transformer LM use, and why?\n\n"
    "Trains small decoder-only transformers that differ only in their positional encoding "
    "and compares them on perplexity, convergence and length extrapolation.",
)
add_hydra_commands(app)        # train, bench
add_runs(app)                  # eval, probe, compare, convert
add_catalogue(app)             # encodings
add_check(app)                 # check: the encoding contract as properties
add_benchmark(app)             # benchmark: the protocol, the shipped baselines
app.add_typer(plot_app, name="plot")  # plot decay | extrapolation


def main() -> None:
    app()


if __name__ == "__main__":
    main()
