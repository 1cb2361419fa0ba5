"""The `posenc bench` command's argv handling and output: table for people, JSON for machines."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from posenc.rundir import write_json_atomic


def split_json_flag(args: list[str]) -> tuple[list[str], str | None]:
    """argv -> (Hydra overrides, JSON destination): '-' for `--json` alone (stdout), a path for
    `--json FILE` (the next argument, when it is not itself an override or a flag), else None."""
    if "--json" not in args:
        return args, None
    i = args.index("--json")
    rest = args[i + 1 :]
    if rest and "=" not in rest[0] and not rest[0].startswith("-"):
        return args[:i] + rest[1:], rest[0]
    return args[:i] + rest, "-"


def run_bench(args: list[str], console: Console, err_console: Console) -> dict:
    from posenc.bench.timing import bench, render

    overrides, json_to = split_json_flag(args)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        task = progress.add_task("bench")
        result = bench(overrides, lambda what: progress.update(task, description=what))
    # with JSON on stdout, the table goes to stderr so stdout stays machine-readable
    (err_console if json_to == "-" else console).print(render(result))
    if json_to == "-":
        print(json.dumps(result, indent=2))
    elif json_to:
        write_json_atomic(Path(json_to), result)
        console.print(f"wrote {json_to}")
    return result
