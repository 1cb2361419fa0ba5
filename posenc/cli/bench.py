"""The `posenc bench` command's argv handling and output: rows for people as they are measured
(a live table on a terminal, one plain line per row otherwise), JSON for machines.

``--json FILE`` is rewritten (atomically) after every row, so a long bench that is stopped
keeps what it measured; ``--json`` alone prints the JSON to stdout at the end, and the rows
go to stderr so stdout stays machine-readable.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from posenc.bench import render
from posenc.bench.run import Listener, bench
from posenc.errors import UserError
from posenc.record.directory import write_json_atomic
from posenc.record.metrics import LOADED_PER_CPU, MACHINE_CPUS, MACHINE_LOAD


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


class LinePrinter(Listener):
    """Without a terminal (a log, a pipe): the title, then one plain line per row as it comes (the
    two baselines' rows together, once both are measured: run.py)."""

    def __init__(self, console: Console, json_file: Path | None) -> None:
        self.console, self.json_file = console, json_file
        self.result: dict | None = None
        self.printed = 0  # rows printed so far
        self.start = time.monotonic()

    def started(self, result: dict) -> None:
        self.result = result
        self.console.print(render.title(result), highlight=False, soft_wrap=True)
        self.console.print(render.LEGEND, highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def progress(self, what: str) -> None:
        """What runs now, as a line with the time since the bench started (a log cannot redraw a spinner)."""
        elapsed = timedelta(seconds=round(time.monotonic() - self.start))
        self.console.print(f"[{elapsed}] {what}", highlight=False, soft_wrap=True, markup=False)

    def row(self, result: dict) -> None:
        if self.json_file:  # first the file, then the line: a row seen is a row saved
            write_json_atomic(self.json_file, result)
        for r in result["results"][self.printed :]:
            for text in (render.line(r), *render.decode_lines(r)):
                self.console.print(text, highlight=False, soft_wrap=True)
        self.printed = len(result["results"])

    def __enter__(self) -> LinePrinter:
        return self

    def __exit__(self, *exc) -> None:
        pass


class LiveTable(LinePrinter):
    """On a terminal: the table grows a row as each model is measured, a spinner says what runs now."""

    def __init__(self, console: Console, json_file: Path | None) -> None:
        super().__init__(console, json_file)
        self.spinner = Spinner("dots", "starting")
        self.live = Live(self.spinner, console=console, refresh_per_second=8, transient=False)

    def _show(self, done: bool = False) -> None:
        parts = render.tables(self.result) if self.result else []
        self.live.update(Group(*parts) if done else Group(*parts, self.spinner), refresh=True)

    def started(self, result: dict) -> None:
        self.result = result
        self._show()

    def progress(self, what: str) -> None:
        elapsed = timedelta(seconds=round(time.monotonic() - self.start))
        self.spinner.update(text=Text(f"{what} [{elapsed}]"))

    def row(self, result: dict) -> None:
        if self.json_file:
            write_json_atomic(self.json_file, result)
        self._show()

    def __enter__(self) -> LiveTable:
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.result:
            self._show(done=True)  # the final table stays; the spinner goes
        self.live.stop()


def run_bench(args: list[str], console: Console, err_console: Console) -> dict:
    overrides, json_to = split_json_flag(args)
    out = err_console if json_to == "-" else console  # with JSON on stdout, people read stderr
    json_file = Path(json_to) if json_to and json_to != "-" else None
    printer = (LiveTable if out.is_terminal else LinePrinter)(out, json_file)
    try:
        with printer:
            result = bench(overrides, printer)
    except KeyboardInterrupt:
        interrupted(printer, json_to, json_file)
        raise
    for line in render.fallback_lines(result):  # under the table: these rows did not run their fast path
        out.print(line, highlight=False, soft_wrap=True)
    if json_to == "-":
        print(json.dumps(result, indent=2))
    elif json_file:
        write_json_atomic(json_file, result)
        out.print(f"wrote {json_file}", highlight=False)
    if (warning := load_warning(result)) is not None:
        err_console.print(warning, highlight=False, soft_wrap=True)
    failed = [r for r in result["results"] if r.get("status") == "failed"]
    if failed:
        raise UserError(f"{len(failed)} of {len(result['results'])} models failed: "
                        + "; ".join(f"{r['name']} ({r['error']})" for r in failed))
    return result


def interrupted(printer: LinePrinter, json_to: str | None, json_file: Path | None) -> None:
    """Ctrl-C: the rows measured so far (a live table keeps them as its last frame; a log gets
    any row still held back, and the table), saved where --json asked, then the interrupt goes on
    (`interrupted: stopped by Ctrl-C`, exit 130)."""
    result = printer.result
    if not result or not result["results"]:
        return
    out = printer.console
    if not isinstance(printer, LiveTable):
        printer.row(result)
        for t in render.tables(result):
            out.print(t)
    planned = len(result.get("planned") or result["results"])
    out.print(f"interrupted after {len(result['results'])} of {planned} models: the rows above are what was "
              f"measured", highlight=False, soft_wrap=True)
    if json_to == "-":
        print(json.dumps({**result, "interrupted": True}, indent=2))
    elif json_file:
        write_json_atomic(json_file, {**result, "interrupted": True})
        out.print(f"wrote {json_file}", highlight=False)


def load_warning(result: dict) -> str | None:
    """One line when the machine's load average exceeded LOADED_PER_CPU per CPU during the bench."""
    samples = [s for s in result.get("load", []) if s]
    busy = [s[MACHINE_LOAD.name] / s[MACHINE_CPUS.name] for s in samples]
    if not busy or max(busy) <= LOADED_PER_CPU:
        return None
    worst = max(samples, key=lambda s: s[MACHINE_LOAD.name] / s[MACHINE_CPUS.name])
    return (f"warning: the machine was loaded while the bench ran (1-min load average up to "
            f"{worst[MACHINE_LOAD.name]:.1f} on {worst[MACHINE_CPUS.name]} CPUs): tokens/s and ms/step measure "
            f"the other processes too; vs nope and vs reference are paired round by round and hold better — "
            f"time absolute figures on a quiet machine")
