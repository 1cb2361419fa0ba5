"""Does a re-run reproduce a shipped row? Every seed's value of every metric against the shipped
one: equal (bit for bit), within the protocol's tolerance (relative on a log-scale metric such as
perplexity, absolute on the others, e.g. accuracy), or not."""

from __future__ import annotations

from dataclasses import dataclass

from posenc.benchmark.data import Row
from posenc.benchmark.protocol import Protocol
from posenc.report.stats import scale_of

EXACT, WITHIN, DIFFERENT = "exact", "within tolerance", "different"


@dataclass(frozen=True)
class SeedMatch:
    metric: str
    seed: int
    shipped: float | None
    rerun: float | None
    verdict: str        # EXACT | WITHIN | DIFFERENT


def seed_verdict(shipped: float | None, rerun: float | None, relative: bool, protocol: Protocol) -> str:
    if shipped is None or rerun is None:
        return EXACT if shipped is None and rerun is None else DIFFERENT
    if shipped == rerun:
        return EXACT
    gap = abs(rerun - shipped) / abs(shipped) if relative and shipped else abs(rerun - shipped)
    return WITHIN if gap <= (protocol.relative_tolerance if relative else protocol.absolute_tolerance) else DIFFERENT


def match(shipped: Row, rerun: Row, protocol: Protocol) -> list[SeedMatch]:
    out = []
    for metric in protocol.metrics:
        relative = scale_of(metric).log
        old, new = shipped.values.get(metric, []), rerun.values.get(metric, [])
        for i, seed in enumerate(protocol.seeds):
            a = old[i] if i < len(old) else None
            b = new[i] if i < len(new) else None
            out.append(SeedMatch(metric, seed, a, b, seed_verdict(a, b, relative, protocol)))
    return out


def overall(matches: list[SeedMatch]) -> str:
    """EXACT when every value is, DIFFERENT when any is, else WITHIN."""
    verdicts = {m.verdict for m in matches}
    return DIFFERENT if DIFFERENT in verdicts else WITHIN if WITHIN in verdicts else EXACT
