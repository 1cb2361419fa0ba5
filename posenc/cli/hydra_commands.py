"""The commands whose arguments are all Hydra overrides: `posenc train` and `posenc bench`."""

from __future__ import annotations

import sys

import typer

from posenc.cli.common import (
    HYDRA_ARGS,
    console,
    err_console,
    fail,
    run_guarded,
    user_wants_traceback,
    without_debug,
)
from posenc.errors import UserError

HELP_FLAGS = ("--help", "-h")


def check_run(cfg, single: bool = False) -> None:
    """What the schema's types cannot say, checked before Hydra creates a run directory. A single
    run's encoding is built once, by training, first (a refusal there removes the run directory);
    a sweep's is built here too, so a sweep whose encoding cannot be built writes nothing."""
    from omegaconf import OmegaConf

    from posenc.config import apply_choice_schemas, validate

    validate(apply_choice_schemas(cfg))  # types and ranges, read from the sources: no torch imported yet
    # start-up (here and in every command below): `posenc --help` imports every command module;
    # what a command needs (torch, Hydra's runner) loads when it runs, and torch only once the
    # config and the data's files are known to be good, so a typo in either is refused in a second
    from posenc.data.corpora import text_files
    from posenc.data.hub_corpora import HubCorpus, sources

    if OmegaConf.select(cfg, "dataset.files") is not None:  # dataset=text: a missing file, before any run dir
        text_files(list(cfg.dataset.files))
    if OmegaConf.select(cfg, "dataset._target_") == f"{HubCorpus.__module__}.{HubCorpus.__name__}":  # dataset=hf, …
        d = cfg.dataset
        sources(d.name, d.get("path"), d.get("data_files"), d.get("load_from_disk"))
    from posenc.build import check_encodable
    from posenc.hardware import resolve_device
    from posenc.train import init_from

    resolve_device(cfg.device)  # device=cuda without CUDA: refused here, not inside the job
    if not single:
        check_encodable(cfg)  # an encoding or layout that cannot be built (layout=gemma3 with alibi)
    init_from.check(cfg)  # a parent whose weights would not fit: refused before any directory exists


def train(ctx: typer.Context) -> None:
    """Train one model, or a sweep with -m; the arguments are Hydra overrides.

    Examples: `posenc train encoding=learned trainer.max_steps=100`,
    `posenc train -m encoding=rope,nope encoding.base=500,10000`.
    """
    from posenc.cli.hydra_entry import run_hydra  # start-up
    from posenc.cli.job_returns import failures
    from posenc.cli.launch import prepare

    args = without_debug(ctx.args)
    if any(a in HELP_FLAGS for a in args):  # Typer's help, then Hydra's (its groups and config)
        console.print(ctx.get_help())
        console.print()
    finished = False

    def run():
        try:
            return run_hydra(prepare(args), check=check_run)
        except UserError as e:  # posenc.train.stop.RunInterrupted: not imported, so a typo never loads torch
            if getattr(e, "quiet", False):  # a DDP rank but 0: rank 0 alone prints the line that says how to continue
                raise typer.Exit(e.exit_code) from None
            raise

    try:  # resume and torchrun fix the run dir before Hydra picks one
        returns = run_guarded(run, user_wants_traceback(ctx.args))
        finished = True
    finally:
        if "posenc.train.distributed" in sys.modules:  # a refused config never loaded torch
            sys.modules["posenc.train.distributed"].shutdown(wait=finished)
    failed = failures(returns)
    if failed:
        fail(f"{len(failed)} of the sweep's {len(returns)} jobs failed: " + "; ".join(failed))


def bench(ctx: typer.Context) -> None:
    """Time training steps per encoding at one shape, against a plain nanoGPT-style reference.

    The arguments are Hydra overrides; `--json` prints JSON to stdout, `--json FILE` writes it.
    Example: `posenc bench encoding=nope,rope,t5_bias model=base trainer.seq_len=1024 --json bench.json`.
    """
    if any(a in HELP_FLAGS for a in ctx.args):
        console.print(ctx.get_help())
        return
    args = without_debug(ctx.args)
    # the first line at once: loading torch and the models takes seconds (minutes on a loaded machine)
    people = err_console if json_to_stdout(args) else console  # with JSON on stdout, people read stderr
    people.print("posenc bench: loading torch; then each model in turn is built, warmed up and timed "
                 "(what runs now is shown below)", highlight=False, soft_wrap=True)
    from posenc.cli.bench import run_bench  # start-up

    run_guarded(lambda: run_bench(args, console, err_console), user_wants_traceback(ctx.args))


def json_to_stdout(args: list[str]) -> bool:
    """`--json` with no file after it (cli/bench.py split_json_flag): the JSON goes to stdout."""
    if "--json" not in args:
        return False
    rest = args[args.index("--json") + 1:]
    return not (rest and "=" not in rest[0] and not rest[0].startswith("-"))


def register(app: typer.Typer) -> None:
    app.command(**HYDRA_ARGS)(train)
    app.command(**HYDRA_ARGS)(bench)
