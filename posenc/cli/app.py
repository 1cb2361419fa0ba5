"""The `posenc` command. Typer owns the command words; Hydra owns everything after them.

`posenc train ARGS` hands ARGS to a ``@hydra.main`` function, so overrides, ``-m`` sweeps,
launchers and ``--config-dir`` all work as Hydra users expect. A mistake a user can make
prints one line, ``error: ...``, and exits 1; ``--debug`` or ``HYDRA_FULL_ERROR=1`` shows
the full traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from posenc.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="posenc: which positional encoding should a transformer LM use, and why?\n\n"
    "Trains small decoder-only transformers that differ only in their positional encoding "
    "and compares them on perplexity, convergence and length extrapolation.",
)
console = Console()
err_console = Console(stderr=True)

HYDRA_ARGS = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True,
                                   "help_option_names": []}}


def user_wants_traceback(args: list[str]) -> bool:
    return "--debug" in args or os.environ.get("HYDRA_FULL_ERROR") == "1"


def fail(message: str) -> None:
    """Print one `error:` line to stderr and exit 1."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def run_guarded(func, debug: bool):
    """Run func() turning any user mistake into one `error:` line (unless debug)."""
    from posenc.cli.explain import explain

    try:
        return func()
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        fail("interrupted")
    except Exception as e:  # noqa: BLE001 - every exception becomes one line unless --debug
        if debug:
            raise
        fail(explain(e))


@app.command(**HYDRA_ARGS)
def train(ctx: typer.Context) -> None:
    """Train one model (or a sweep with -m). Arguments are Hydra overrides:

    posenc train encoding=learned trainer.max_steps=100

    posenc train -m encoding=rope,nope encoding.base=500,10000
    """
    args = [a for a in ctx.args if a != "--debug"]
    if "--help" in args or "-h" in args:
        console.print(ctx.get_help())
        console.print()
    from posenc.cli import hydra_entry as entry

    debug = user_wants_traceback(ctx.args)
    from posenc.train import distributed
    from posenc.cli import launch

    user_setting = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let exceptions reach us; we decide how to print them
    try:  # resume and torchrun fix the run dir before Hydra picks one
        run_guarded(lambda: entry.hydra_train(launch.prepare_args(args)), debug)
    finally:
        distributed.shutdown()
        if user_setting is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_setting
    if entry.FAILED_JOBS:
        fail(f"{len(entry.FAILED_JOBS)} of the sweep's jobs failed: " + "; ".join(entry.FAILED_JOBS))


@app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_(ctx: typer.Context, run_dir: Path = typer.Argument(..., help="a run directory (holds checkpoints/last.pt)")) -> None:
    """Perplexity of a trained run at eval.lengths × its training length. Overrides follow:

    posenc eval outputs/…/run eval.lengths=[1,2,4,8,16] eval.stride=64

    posenc eval outputs/…/run encoding.scaling=yarn encoding.scaling_factor=4
    """
    from posenc.eval.run import eval_run

    args = [a for a in ctx.args if a != "--debug"]
    run_guarded(lambda: eval_run(run_dir, args), user_wants_traceback(ctx.args))


from posenc.cli.plot import plot_app  # noqa: E402  (a sub-app: `posenc plot decay|extrapolation`)

app.add_typer(plot_app, name="plot")


@app.command()
def compare(
    paths: list[Path] = typer.Argument(..., help="run directories, sweep directories, or folders of them"),
    by: list[str] = typer.Option(None, "--by", help="group by this config key (repeatable); default: the keys the sweep varied"),
    metric: str = typer.Option("val/ppl", "--metric", help="the metric plotted against the swept value"),
    out: Path = typer.Option(None, "--out", help="where report.md/.html and the PNGs go; default: the sweep directory"),
    target: list[float] = typer.Option(None, "--target", help="val/loss for tokens-to-loss (repeatable); default: the runs' own"),
    debug: bool = typer.Option(False, "--debug", help="show the full traceback on error"),
) -> None:
    """Compare runs: a table (mean ± std over seeds), PNG plots, report.md and report.html."""
    from posenc.report.compare import compare as compare_runs

    run_guarded(lambda: compare_runs(paths, by, metric, out, target, console), debug)


@app.command(**HYDRA_ARGS)
def bench(ctx: typer.Context) -> None:
    """Time training steps per encoding at one shape, against a plain nanoGPT-style reference.
    Arguments are Hydra overrides; `--json` prints JSON to stdout, `--json FILE` writes it:

    posenc bench encoding=nope,rope,t5_bias model=base trainer.seq_len=1024 --json bench.json
    """
    from posenc.cli.bench import run_bench

    if "--help" in ctx.args or "-h" in ctx.args:
        console.print(ctx.get_help())
        return
    run_guarded(lambda: run_bench([a for a in ctx.args if a != "--debug"], console, err_console),
                user_wants_traceback(ctx.args))


@app.command()
def encodings() -> None:
    """List the encodings and their options (from conf/encoding/*.yaml)."""
    from rich.markup import escape
    from rich.table import Table

    from posenc.config import encoding_catalogue

    table = Table(title="positional encodings", title_justify="left")
    table.add_column("encoding=", style="bold cyan")
    table.add_column("what it is")
    table.add_column("options (encoding.<key>=…, default)")
    for name, doc, options in encoding_catalogue():
        table.add_row(name, escape(doc), escape("\n".join(f"{k}={v}" for k, v in options.items())) or "—")
    console.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
