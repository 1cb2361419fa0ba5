"""What `posenc leaderboard` does, once its options are parsed (posenc/cli/leaderboard.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

import posenc
from posenc.cli.leaderboard_place import place_new, reproduce_row
from posenc.cli.leaderboard_run import OUTPUTS, regenerate
from posenc.config import group_options
from posenc.errors import UserError
from posenc.leaderboard.carry import carry_over
from posenc.leaderboard.checked import check_cell, check_record
from posenc.leaderboard.data import Baselines, baselines_path, document, load_baselines
from posenc.leaderboard.page import render
from posenc.leaderboard.protocol import (
    DEFAULT_PROTOCOL,
    Protocol,
    as_recorded,
    encoding_overrides,
    load_protocol,
    protocol_hash,
    resolved,
)
from posenc.record.directory import write_json_atomic


def leaderboard_path(name: str = DEFAULT_PROTOCOL) -> Path:
    """docs/leaderboard.md (the default protocol's page), or docs/leaderboard-<name>.md (an earlier
    protocol's, kept readable), of the source checkout posenc runs from (an editable install)."""

    docs = Path(posenc.__file__).resolve().parent.parent / "docs"
    if not docs.is_dir():
        raise UserError(f"no docs/ beside the posenc package ({docs}) — write the leaderboard from a source checkout "
                        f"(pip install -e .)")
    return docs / ("leaderboard.md" if name == DEFAULT_PROTOCOL else f"leaderboard-{name}.md")


def write_page(baselines: Baselines, protocol: Protocol, console: Console) -> Path:
    """docs/leaderboard.md for a shipped protocol; <file>.md beside a protocol given as a file."""

    is_file = protocol.source.endswith((".yaml", ".yml"))
    path = Path(protocol.source).with_suffix(".md") if is_file else leaderboard_path(protocol.name)
    path.write_text(render(baselines, protocol))
    console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    return path


def checked_baselines(protocol: Protocol) -> tuple[Baselines, str]:
    """The shipped data, refused when it was measured under another protocol hash (keys posenc
    gained since are not part of it: ``as_recorded``)."""
    baselines = load_baselines(protocol)
    recorded = baselines.raw["protocol"].get("config")
    current = protocol_hash(as_recorded(resolved(protocol), recorded)[0] if recorded else resolved(protocol))
    if baselines.hash != current:
        raise UserError(f"the shipped baselines of {protocol.name} were measured under protocol hash {baselines.hash}, "
                        f"but this posenc's protocol hashes to {current} (a default the protocol inherits changed) — "
                        f"regenerate them (`posenc leaderboard --regenerate`) or use the posenc version that made them "
                        f"({baselines.raw['versions']['posenc']})")
    return baselines, current


def regenerate_all(protocol: Protocol, jobs: int, console: Console) -> None:
    """Every shipped encoding under the protocol; the shipped data and the page rewritten from the runs."""
    import time


    config = resolved(protocol)
    if baselines_path(protocol).is_file():  # keys added since the shipped data are not part of its protocol
        recorded, _ = as_recorded(config, load_baselines(protocol).raw["protocol"]["config"])
        if protocol_hash(recorded) == load_baselines(protocol).hash:
            config = recorded  # the runs already measured under it are kept
    hash_ = protocol_hash(config)
    started = time.monotonic()
    rows = regenerate(protocol, hash_, list(protocol.encodings) or group_options("encoding"), jobs, OUTPUTS / protocol.name / "regenerate",
                      lambda line: console.print(line, highlight=False, soft_wrap=True))
    rows = [dataclasses.replace(row, check=check_record([f"encoding={row.label}"])) for row in rows]
    command = "posenc leaderboard --regenerate" + (f" --jobs {jobs}" if jobs > 1 else "")
    doc = document(config, hash_, protocol.description, rows, command)
    path = baselines_path(protocol)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    console.print(f"wrote {path} ({len(rows)} encodings, {time.monotonic() - started:.0f} s)", highlight=False)
    write_page(load_baselines(protocol), protocol, console)


def recheck_all(protocol: Protocol, console: Console) -> None:
    """`posenc check` on every shipped row's encoding; the rows' check records and the page rewritten
    (nothing else in the shipped data changes)."""
    import json

    baselines, _ = checked_baselines(protocol)
    path = baselines_path(protocol)
    raw = json.loads(path.read_text())
    for row in baselines.rows:
        raw["rows"][row.label]["check"] = record = check_record([f"encoding={row.label}"])
        console.print(f"{row.label}: {check_cell(record)}", highlight=False, soft_wrap=True)
    write_json_atomic(path, raw)
    console.print(f"wrote {path} (check records of {len(baselines.rows)} rows)", highlight=False, soft_wrap=True)
    write_page(load_baselines(protocol), protocol, console)


def carry_all(protocol: Protocol, source: str, console: Console) -> None:
    """The shipped data of a protocol that runs what an earlier one ran: its rows (benchmark/carry.py)."""

    doc = carry_over(protocol, source, f"posenc leaderboard --regenerate --carry-from {source}")
    path = baselines_path(protocol)
    write_json_atomic(path, doc)
    console.print(f"wrote {path} ({len(doc['rows'])} encodings, carried over from {source})", highlight=False)
    write_page(load_baselines(protocol), protocol, console)


def main(args: list[str], config_dir: str | None, chosen: dict[str, object], jobs: int, protocol_name: str | None,
         console: Console, despite_check: bool = False, carry_from: str | None = None) -> None:
    """chosen: each mode flag (--reproduce NAME, --regenerate, --write-docs, --recheck) and its value."""
    modes = [m for m, on in chosen.items() if on]
    reproduce = chosen.get("--reproduce")
    if carry_from and not chosen.get("--regenerate"):
        raise UserError("--carry-from goes with --regenerate: `posenc leaderboard --regenerate --carry-from NAME`")
    if len(modes) > 1:
        raise UserError(f"{' and '.join(modes)} cannot be given together — pick one")
    if modes and args:
        raise UserError(f"{modes[0]} takes no overrides (the shipped encodings run as the protocol defines them)")
    if config_dir and modes:
        raise UserError(f"--config-dir is for a new encoding; {modes[0]} runs the shipped ones")
    if despite_check and modes:
        raise UserError(f"--despite-check is for placing a new encoding; {modes[0]} places none")
    protocol = load_protocol(protocol_name or DEFAULT_PROTOCOL)
    if chosen.get("--regenerate") and carry_from:
        return carry_all(protocol, carry_from, console)
    if chosen.get("--regenerate"):
        return regenerate_all(protocol, jobs, console)
    if chosen.get("--write-docs"):
        write_page(checked_baselines(protocol)[0], protocol, console)
        return
    if chosen.get("--recheck"):
        return recheck_all(protocol, console)

    if reproduce:
        return reproduce_row(protocol, *checked_baselines(protocol), reproduce, console)

    overrides = encoding_overrides(args)  # refused before the protocol is composed: one line, at once
    place_new(protocol, *checked_baselines(protocol), overrides, config_dir, console, despite_check)
