"""`posenc check [overrides…]`: the encoding contract as properties (posenc/check), one table row
each, exit 1 when one fails. The overrides are Hydra's, composed as every command composes them;
``--config-dir DIR`` adds a directory of the user's own configs (a plug-in encoding's YAML) to
Hydra's search path; ``--only GROUP`` (repeatable) runs the groups of properties named so
(posenc.check.CHECKS: ``--only cuda`` is the CUDA rows alone). ``--write-shipped`` measures every
shipped encoding and layout and rewrites the verdicts posenc ships (posenc/check/shipped.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from posenc.cli.common import (
    HYDRA_ARGS,
    console,
    run_guarded,
    user_wants_traceback,
    without_debug,
)
from posenc.config.searchpath import SEARCH_ORDER, add_config_dirs
from posenc.errors import UserError

if TYPE_CHECKING:
    from rich.table import Table

    from posenc.check import CheckResult, Subject

HELP_FLAGS = ("--help", "-h")


def check(ctx: typer.Context,
          config_dir: Optional[Path] = typer.Option(None, "--config-dir", help="a directory of your own configs "
                                                    f"(encoding/<name>.yaml), as every command takes it; {SEARCH_ORDER}"),
          only: Optional[list[str]] = typer.Option(None, "--only", metavar="GROUP", help="run only this group of "
                                                   "properties (repeatable): causality, attention paths, …, cuda"),
          write_shipped: bool = typer.Option(False, "--write-shipped", help="measure every shipped encoding and "
                                             "layout and rewrite the verdicts posenc ships (posenc/check/shipped.json)")
          ) -> None:
    """Check an encoding's contract: causality, every attention path against a float64 reference,
    shift invariance, the run's training precision (trainer.precision) up to its longest evaluation,
    batches, documents and windows, every parameter able to learn, checkpoints, long inputs.

    The arguments are Hydra overrides. Examples: `posenc check encoding=rope`,
    `posenc check encoding=fox encoding@encoding.inner=alibi`, `posenc check --config-dir mine encoding=logdist`,
    `posenc check --only cuda encoding=t5_bias` (the CUDA rows alone).
    """
    if any(a in HELP_FLAGS for a in ctx.args):
        console.print(ctx.get_help())
        return
    if write_shipped:
        run_guarded(lambda: ship(without_debug(ctx.args), only), user_wants_traceback(ctx.args))
        return
    failed = run_guarded(lambda: run_check(without_debug(ctx.args), config_dir, only),
                         user_wants_traceback(ctx.args))
    if failed:
        raise typer.Exit(1)


def ship(args: list[str], only: list[str] | None) -> None:
    """--write-shipped: every shipped encoding's and layout's verdict measured, shipped.json rewritten."""
    from posenc.check.shipped import write_shipped  # start-up: posenc.check imports torch

    if args or only:
        raise UserError("--write-shipped measures posenc's own encodings and layouts as they ship: it takes no "
                        "overrides and no --only")
    write_shipped(lambda line: console.print(line, highlight=False, soft_wrap=True))


def groups(only: list[str] | None) -> set[str] | None:
    """--only's names (any case) -> the groups of posenc.check.CHECKS they name; None for all."""
    from posenc.check import CHECKS  # start-up: posenc.check imports torch

    if not only:
        return None
    known = {what.lower(): what for what, _ in CHECKS}
    unknown = [name for name in only if name.lower() not in known]
    if unknown:
        raise UserError(f"--only {unknown[0]}: no such group of properties — choose from {', '.join(known)}")
    return {known[name.lower()] for name in only}


def run_check(overrides: list[str], config_dir: Path | None = None, only: list[str] | None = None) -> int:
    """Compose, check (the groups of --only, or all), print the table; the number of properties that
    fail. config_dir: added to the search path as every command's --config-dir is
    (posenc/config/searchpath.py)."""
    from posenc.check import (  # start-up: posenc.check imports torch
        compose_subject,
        run_checks,
    )

    chosen = groups(only)
    if config_dir is not None:
        add_config_dirs([config_dir])
    subject = compose_subject(overrides)
    with console.status("checking…") if console.is_terminal else contextlib.nullcontext():
        rows = run_checks(subject, only=chosen)
    console.print(table(subject, rows))
    failed = [r for r in rows if r.failed]
    offered = [r for r in rows if r.status.name != "NOT_OFFERED"]
    if failed:
        console.print(f"{len(failed)} of {len(offered)} properties fail: {', '.join(r.name for r in failed)}",
                      style="bold red", highlight=False)
    else:
        console.print(f"all {len(offered)} properties hold ({len(rows) - len(offered)} not offered)",
                      style="bold green", highlight=False)
    return len(failed)


def table(subject: Subject, rows: list[CheckResult]) -> Table:
    """One row per property: name, measured, ✓/✗/—, and why where it fails or does not apply."""
    from rich.markup import escape
    from rich.table import Table

    from posenc.check.verdict import variant  # start-up: posenc.check imports torch

    cfg = subject.cfg
    shape = (f"d_model {cfg.model.d_model}, {cfg.model.n_head} heads, {cfg.model.n_layer} layers, T {subject.T}; "
             f"precision rows in {subject.precision} to position {subject.longest}")
    t = Table(title=f"encoding {variant(cfg)}, layout {cfg.layout.name} ({shape})",
              title_justify="left", caption="reference: float64 attention written out from the encoding hooks; masks: "
              "causal, documents, sliding 5, documents+sliding 5, documents+chunks of 4; tolerances: float64 against "
              "float64 1e-10, the shift and precision rows the rounding of their dtype (the bound they show)",
              caption_justify="left")
    t.add_column("property", style="bold", no_wrap=True)
    t.add_column("measured")
    t.add_column("", no_wrap=True, min_width=1)
    t.add_column("note", ratio=1, min_width=20)
    colour = {"PASS": "green", "FAIL": "bold red", "NOT_OFFERED": "dim"}
    for r in rows:
        t.add_row(escape(r.name), escape(r.measured), f"[{colour[r.status.name]}]{r.status.value}[/]", escape(r.note))
    return t


def register(app: typer.Typer) -> None:
    app.command(**HYDRA_ARGS)(check)
