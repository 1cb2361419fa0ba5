"""What `posenc check` says of an encoding the benchmark places or ships. A row keeps the record
{"version": the checks' version, "failed": the properties that fail} (posenc/leaderboard/data.py),
the leaderboard page shows it beside the numbers, and `posenc leaderboard` refuses to place an
encoding that fails a property unless told to place it marked (posenc/cli/leaderboard_place.py):
a number measured on an encoding that breaks the contract (a bias that reads the window's length,
a token that sees its future) is not a result about positional encoding."""

from __future__ import annotations


def check_record(overrides: list[str]) -> dict:
    """Run every property of `posenc check` on the encoding the overrides choose (its tiny model, as
    the command does): {"version": check_version(), "failed": [property, ...]}, and "caveats": [what
    holds only with a qualification, e.g. a decoding cache stale beyond a length] where there are any."""
    from posenc.check import check_version, compose_subject, run_checks  # start-up: the checks import torch

    rows = run_checks(compose_subject(overrides))
    caveats = [f"{r.name}: {r.caveat}" for r in rows if r.caveat]
    return {"version": check_version(), "failed": [r.name for r in rows if r.failed],
            **({"caveats": caveats} if caveats else {})}


def check_cell(record: dict | None) -> str:
    """'✓', '✓ (decoding: …stale beyond 24…)', '✗ prefix: …, documents: …' or 'not checked'."""
    if record is None:
        return "not checked"
    caveats = f" ({'; '.join(record['caveats'])})" if record.get("caveats") else ""
    return ("✓" if not record["failed"] else "✗ " + "; ".join(record["failed"])) + caveats
