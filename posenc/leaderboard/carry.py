"""A new protocol version that changes how a re-run is judged, not what is run, keeps the rows
already measured: `posenc leaderboard --regenerate --carry-from posenc-pe-v1` takes an earlier
protocol's shipped rows when its seeds and every arm (experiment, overrides, metrics and the config
they compose to) are this protocol's, and refuses otherwise. The rows keep the machine, versions,
date and command that measured them; the file records where they came from."""

from __future__ import annotations

from datetime import datetime, timezone

from posenc.errors import UserError
from posenc.leaderboard.data import Baselines, document, load_baselines
from posenc.leaderboard.protocol import (
    Protocol,
    as_recorded,
    load_protocol,
    protocol_hash,
    resolved,
)


def first_difference(now: object, then: object, where: str = "") -> str | None:
    """The first dotted key at which two resolved configs differ (None: equal)."""
    if isinstance(now, dict) and isinstance(then, dict):
        for key in sorted(set(now) | set(then)):
            if key not in now or key not in then:
                return f"{where}{key}"
            found = first_difference(now[key], then[key], f"{where}{key}.")
            if found:
                return found
        return None
    return None if now == then else where.rstrip(".")


def carried_document(protocol: Protocol, source: Protocol, source_baselines: Baselines, command: str) -> dict:
    """The shipped file of ``protocol`` made of ``source``'s rows, which must have been measured by
    the same arms and seeds (keys posenc gained since the source's data are not part of either)."""
    recorded = source_baselines.raw["protocol"]["config"]
    config = resolved(protocol)
    config["arms"] = as_recorded(config["arms"], recorded["arms"])[0]
    differs = first_difference({"seeds": config["seeds"], "arms": config["arms"]},
                               {"seeds": recorded["seeds"], "arms": recorded["arms"]})
    if differs:
        raise UserError(f"--carry-from {source.name}: its rows were measured with another {differs} than "
                        f"{protocol.name} runs — measure them (`posenc leaderboard --regenerate --protocol {protocol.name}`)")
    raw = source_baselines.raw
    doc = document(config, protocol_hash(config), protocol.description, source_baselines.rows, raw["command"])
    doc.update(date=raw["date"], versions=raw["versions"], machine=raw["machine"],
               carried_from={"protocol": source.name, "hash": source_baselines.hash, "command": command,
                             "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")})
    return doc


def carry_over(protocol: Protocol, source_name: str, command: str) -> dict:

    if source_name == protocol.name:
        raise UserError(f"--carry-from {source_name}: that is the protocol being regenerated — name an earlier one")
    source = load_protocol(source_name)
    return carried_document(protocol, source, load_baselines(source), command)
