"""The commands that read run directories: `posenc eval`, `posenc probe`, `posenc compare` and `posenc convert`."""

from __future__ import annotations

from pathlib import Path

import typer

from posenc.cli.common import console, run_guarded, user_wants_traceback, without_debug
from posenc.record.rundir import LAST_CHECKPOINT, LEGACY_CHECKPOINTS, RunDir

RUN_DIR_HELP = f"a run directory (holds {LAST_CHECKPOINT})"
NO_CHECK_HELP = "do not look up (or measure) `posenc check`'s verdict on the encoding"


def verdict_lookup(no_check: bool):
    """The lookup eval and probe call with the run's config: `posenc check`'s verdict, said where it
    fails (posenc/check/verdict.py); None with --no-check."""
    if no_check:
        return None
    from posenc.check.verdict import carried  # start-up: the checks import torch

    return carried


def eval_(ctx: typer.Context, run_dir: Path = typer.Argument(..., help=RUN_DIR_HELP),
          no_check: bool = typer.Option(False, "--no-check", help=NO_CHECK_HELP)) -> None:
    """Perplexity of a trained run at eval.lengths × its training length; Hydra overrides follow.

    Examples: `posenc eval outputs/…/run eval.lengths=[1,2,4,8,16] eval.stride=64`,
    `posenc eval outputs/…/run encoding.scaling=yarn encoding.scaling_factor=4`.
    """
    from posenc.eval.run import eval_run  # start-up: each command imports what it needs when it runs

    run_guarded(lambda: eval_run(run_dir, without_debug(ctx.args), verdict_lookup(no_check)),
                user_wants_traceback(ctx.args))


def probe(ctx: typer.Context, run_dir: Path = typer.Argument(..., help=RUN_DIR_HELP),
          no_check: bool = typer.Option(False, "--no-check", help=NO_CHECK_HELP)) -> None:
    """Attention probes of a trained run at 1×, 2×, 4× its training length: entropy, distance,
    RoPE frequency usage, position biases -> RUN_DIR/probes/ (probes.json and PNGs)."""
    from posenc.eval.probe_run import probe_run  # start-up

    paths = run_guarded(lambda: probe_run(run_dir, without_debug(ctx.args), verdict_of=verdict_lookup(no_check)),
                        user_wants_traceback(ctx.args))
    out = RunDir(run_dir).probes_dir
    console.print(f"wrote [bold]{len(paths)}[/] files under [bold]{out}[/]:", soft_wrap=True)
    for path in paths:
        console.print(f"  {path.relative_to(out)}", highlight=False, soft_wrap=True)


def compare(
    paths: list[Path] = typer.Argument(..., help="run directories, sweep directories, or folders of them"),
    by: list[str] = typer.Option(None, "--by", help="group by this config key (repeatable); default: the keys the sweep varied"),
    metric: str = typer.Option(None, "--metric", help="the headline metric: ranked, plotted against the swept value, "
                               "compared to --baseline; default: a task's accuracy at the training length, else "
                               "val/ppl, else val/loss"),
    out: Path = typer.Option(None, "--out", help="where report.md/.html and the PNGs go; default: the run or sweep "
                             "directory given (several: outputs/compare/<date>/<time>)"),
    target: list[str] = typer.Option(None, "--target", help="tokens to reach this val/loss in nats (2.5), or this "
                                     "val/bpb with a bpb suffix (1.2bpb: any tokenizer); repeatable; default: the runs' own"),
    baseline: str = typer.Option(None, "--baseline", help="a group (its --by value, e.g. rope): every other group's "
                                 "difference to it on --metric, with a 95% interval and a verdict"),
    within: str = typer.Option(None, "--within", help="rank the groups separately for each value of this key "
                               "(e.g. model.flavor) and measure how well the rankings agree (Kendall's τ, flips)"),
    seeds: bool = typer.Option(False, "--seeds", help="also print every seed's value (report.md/html always have them)"),
    no_check: bool = typer.Option(False, "--no-check", help="do not look up `posenc check`'s verdict for runs that "
                                  "recorded none (recorded verdicts still mark their arms)"),
    debug: bool = typer.Option(False, "--debug", help="show the full traceback on error"),
) -> None:
    """Compare runs: tables (mean and 95% interval over seeds), the groups ranked with rank intervals
    and a verdict (best only where detectable), PNG plots, report.md and report.html. An arm whose
    encoding fails `posenc check` is marked ✗check."""
    from posenc.report.compare import compare as compare_runs  # start-up

    run_guarded(lambda: compare_runs(paths, by, metric, out, target, console, baseline, within, seeds,
                                     None if no_check else run_verdict), debug)


def run_verdict(path: Path) -> dict | None:
    """`posenc check`'s verdict for a run that recorded none (made before runs recorded it), from its
    config, where its encoding's code is still the code it was trained with (else None: today's
    verdict would be about other code), and where one can be had (a run whose config cannot be read
    or checked has none: its arm is left unmarked, without a warning)."""
    from posenc.check.verdict import announce, lookup  # start-up: the checks import torch
    from posenc.errors import UserError
    from posenc.record import provenance
    from posenc.record.rundir import load_run_config

    run = RunDir(path)
    try:
        if provenance.changes(run):
            return None
    except UserError:  # its module cannot be imported now: nothing to check
        return None
    try:
        cfg = load_run_config(run, [])
    except Exception:  # noqa: BLE001 - an unreadable config: no verdict, as for a run that cannot say
        return None
    verdict = lookup(cfg)
    return None if verdict.source == "error" else announce(verdict, cfg)


def convert(
    run_dir: Path = typer.Argument(..., help=f"a run directory made before checkpoint format 2 (holds {LEGACY_CHECKPOINTS})"),
    debug: bool = typer.Option(False, "--debug", help="show the full traceback on error"),
) -> None:
    """Rewrite an old run dir's pickled checkpoints as safetensors + JSON, which eval, probe,
    resume and init_from read; only tensors and RNG state are unpickled, never code."""
    from posenc.record.convert import convert as convert_run  # start-up

    written = run_guarded(lambda: convert_run(run_dir), debug)
    for path in written:
        console.print(f"wrote [bold]{path}[/]")
    console.print(f"the pickled {LEGACY_CHECKPOINTS} are kept as they were; delete them once you no longer need them")


def register(app: typer.Typer) -> None:
    app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(eval_)
    app.command()(compare)
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(probe)
    app.command()(convert)
