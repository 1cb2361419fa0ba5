"""`posenc leaderboard`'s two runs and what they print: a new encoding placed among the shipped rows
(intervals, rank intervals, its verdict against each shipped row: compare's statistics,
posenc/leaderboard/place.py), and a shipped row re-run against its shipped values (posenc/leaderboard/match.py)."""

from __future__ import annotations

import dataclasses
import re

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posenc.cli.leaderboard_run import OUTPUTS, run_encoding, stamp, time_arms
from posenc.errors import UserError
from posenc.leaderboard.checked import check_cell, check_record
from posenc.leaderboard.data import Baselines, cpu_model, row_to_json, versions
from posenc.leaderboard.eta import Clock
from posenc.leaderboard.match import DIFFERENT, DRAW, EXACT, SeedMatch, match, overall
from posenc.leaderboard.page import cell, fmt_of, sort_key
from posenc.leaderboard.place import Placement, place
from posenc.leaderboard.protocol import Protocol, Tolerance, label_of
from posenc.record.directory import write_json_atomic
from posenc.report.stats import BETTER, WORSE, Difference
from posenc.report.tables import format_difference

VERDICT_MARK = {BETTER: "better", WORSE: "worse"}


def announce(protocol: Protocol, baselines: Baselines, label: str, args: list[str], console: Console) -> Clock:
    """What is about to run, and how long it will take here: each arm's run measured on this machine
    now (posenc/leaderboard/eta.py; the shipped rows' times were taken on a loaded machine)."""
    console.print(f"benchmark {protocol.name} (hash {baselines.hash}) for [bold]{escape(label)}[/]: "
                  f"{len(protocol.arms)} arms × seeds {','.join(map(str, protocol.seeds))}; timing a few steps of each "
                  f"arm here…", highlight=False, soft_wrap=True)
    clock = time_arms(protocol, args)
    console.print(escape(clock.plan()), highlight=False, soft_wrap=True)
    return clock


def placement_table(placements: list[Placement], protocol: Protocol, new: str,
                    checks: dict[str, dict | None] | None = None) -> Table:
    """Every row (the new one marked), per metric: mean [95% interval] {rank interval}, and what
    `posenc check` says of each row's encoding (✓, or ✗ naming the properties that fail)."""
    key = sort_key([p.metric for p in placements])
    table = Table(title=f"{new} among the shipped rows of {protocol.name} (mean [95% interval] {{rank interval}}, "
                  f"sorted by {protocol.metrics[key]})", title_justify="left")
    table.add_column("encoding", style="bold cyan")
    for p in placements:
        table.add_column(protocol.metrics[p.metric], justify="right")
    table.add_column("posenc check")
    last_ppl = next(p for p in placements if p.metric == key)
    order = [r.label for r in last_ppl.ranking.ranks]
    order += [label for label in last_ppl.stats if label not in order]
    for label in order:
        cells = []
        for p in placements:
            rank = next(((r.low, r.high) for r in p.ranking.ranks if r.label == label), None)
            cells.append(escape(cell(p.stats[label], fmt_of(p.metric), rank, False)))
        name = f"▶ {label}" if label == new else label
        check = check_cell((checks or {}).get(label))
        table.add_row(escape(name), *cells, escape(check), style="bold yellow" if label == new else None)
    return table


def versus_table(placements: list[Placement], protocol: Protocol, new: str) -> Table:
    """The new row against each shipped one: ratio (perplexity) or difference (accuracy), Welch 95%, verdict."""
    table = Table(title=f"{new} against each shipped row (ratio of perplexities, difference of accuracies; Welch "
                  "95% interval; better/worse only where it excludes no difference, else ≈; ≈ CPU where it does but "
                  "is within how far another CPU moves the metric, the protocol's reproduction tolerance; — where a "
                  "row has no value)", title_justify="left")
    table.add_column("vs", style="bold cyan")
    for p in placements:
        table.add_column(protocol.metrics[p.metric], justify="right")
    for label in placements[0].versus:
        cells = []
        for p in placements:
            v = p.versus[label]
            if v.difference is None:  # a side without the value in every seed (learned past its table)
                cells.append("—")
                continue
            mark = VERDICT_MARK.get(v.verdict, "≈")
            if mark in VERDICT_MARK.values() and within_cpu_spread(v.difference, protocol.tolerance_of(p.metric)):
                mark = "≈ CPU"  # the shipped rows came from another CPU: a difference it could make is no verdict
            cells.append(escape(f"{format_difference(v, fmt_of(p.metric))} {mark}"))
        table.add_row(escape(label), *cells)
    return table


def within_cpu_spread(d: Difference, tolerance: Tolerance) -> bool:
    """Whether a difference to a shipped row (a ratio on a log scale) is one another CPU could make."""
    gap = abs(d.diff - 1) if d.ratio else abs(d.diff)
    return gap <= tolerance.value


def safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)


def checked_first(args: list[str], label: str, despite: bool, console: Console) -> dict:
    """`posenc check` on the encoding before any run: its record, or a refusal (one line, nothing
    written) when a property fails, unless ``despite`` (then the row is placed, marked)."""

    console.print(f"checking {escape(label)} first (`posenc check {escape(' '.join(args))}`)…", highlight=False,
                  soft_wrap=True)
    record = check_record(args)
    if record["failed"] and not despite:
        raise UserError(f"{label} fails `posenc check` ({'; '.join(record['failed'])}), so its numbers would not be "
                        f"about positional encoding — run `posenc check {' '.join(args)}` for why and fix it, or pass "
                        f"--despite-check to place it marked as failing")
    if record["failed"]:
        console.print(f"[bold red]fails `posenc check`:[/] {escape('; '.join(record['failed']))} — placed as asked "
                      f"(--despite-check), marked ✗", highlight=False, soft_wrap=True)
    return record


def place_new(protocol: Protocol, baselines: Baselines, hash_: str, args: list[str], config_dir: str | None,
              console: Console, despite_check: bool = False) -> None:

    label = label_of(args)
    check = checked_first(args, label, despite_check, console)
    clock = announce(protocol, baselines, label, args, console)
    root = OUTPUTS / protocol.name / f"{stamp()}_{safe(label)}"
    row = run_encoding(protocol, label, args, config_dir, root, lambda s: console.print(s, highlight=False, soft_wrap=True),
                       clock)
    row = dataclasses.replace(row, check=check)
    write_json_atomic(root / "benchmark.json", {"protocol": protocol.name, "hash": hash_, "label": label,
                                                "overrides": args, "versions": versions(), **row_to_json(row)})
    for error in row.errors:
        console.print(f"[bold red]failed:[/] {escape(error)}", highlight=False, soft_wrap=True)
    for arm, entries in row.kernels.items():  # a run off its fast kernel path: its minutes are not that path's
        for seed, entry in zip(protocol.seeds, entries):
            if "↓" in entry:
                console.print(f"kernels fell back: {arm} seed {seed}: {escape(entry)}", highlight=False, soft_wrap=True)
    placements = place(baselines.rows, row, list(protocol.metrics), protocol.seeds)
    console.print(placement_table(placements, protocol, label, {r.label: r.check for r in [*baselines.rows, row]}))
    console.print(versus_table(placements, protocol, label))
    console.print(f"runs and benchmark.json: {root}", highlight=False, soft_wrap=True)


def reproduce_row(protocol: Protocol, baselines: Baselines, hash_: str, name: str, console: Console) -> None:
    """Re-run a shipped encoding; a table of every value and one line: matched exactly, within
    tolerance, or not (exit 1)."""

    shipped = next((r for r in baselines.rows if r.label == name), None)
    if shipped is None:
        raise UserError(f"--reproduce {name}: no shipped row of that name — one of {', '.join(r.label for r in baselines.rows)}")
    clock = announce(protocol, baselines, name, [f"encoding={name}"], console)
    root = OUTPUTS / protocol.name / f"{stamp()}_reproduce_{safe(name)}"
    rerun = run_encoding(protocol, name, [f"encoding={name}"], None, root,
                         lambda s: console.print(s, highlight=False, soft_wrap=True), clock)
    matches = match(shipped, rerun, protocol)
    console.print(reproduction_table(matches, protocol, baselines, name))
    verdict = overall(matches)
    if verdict == EXACT:
        console.print(f"reproduced: every value of {name} equals the shipped one exactly", highlight=False)
        return
    tolerance = "; ".join(f"{protocol.metrics[m]} {protocol.tolerance_of(m)}" for m in protocol.metrics)
    if verdict != DIFFERENT:
        console.print(f"reproduced within the protocol's tolerance, not bit for bit ({tolerance}): the spread "
                      f"measured between CPUs, docs/leaderboard.md", highlight=False, soft_wrap=True)
        return
    bad = [m for m in matches if m.verdict == DIFFERENT]
    console.print(f"[bold red]not reproduced:[/] {len(bad)} of {sum(m.verdict != DRAW for m in matches)} judged values "
                  f"of {name} differ beyond the protocol's tolerance ({tolerance}); runs in {root}",
                  highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def reproduction_table(matches: list[SeedMatch], protocol: Protocol, baselines: Baselines, name: str) -> Table:
    """Every seed's shipped and re-run value (every digit: "exact" means bit for bit), and the mean
    over seeds where the protocol judges a metric by it; the shipped data's machine and this one."""
    shipped_on, here = baselines.raw["machine"]["cpu"], cpu_model()
    table = Table(title=f"{name}: shipped (measured on {shipped_on}, torch {baselines.raw['versions']['torch']}) "
                  f"against this re-run ({here}, torch {versions()['torch']})", title_justify="left")
    for head in ("metric", "seed", "shipped", "re-run", "match"):
        table.add_column(head, justify="left" if head == "metric" else "right")
    show = lambda v: "—" if v is None else repr(v)  # noqa: E731
    for m in matches:
        table.add_row(protocol.metrics[m.metric], "mean" if m.seed is None else str(m.seed), show(m.shipped),
                      show(m.rerun), m.verdict, style="red" if m.verdict == DIFFERENT else "dim" if m.verdict == DRAW else None)
    return table
