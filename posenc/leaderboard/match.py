"""Does a re-run reproduce a shipped row? Every metric against the shipped values, as the
protocol's tolerance for it says (Protocol.tolerance_of): seed by seed (a perplexity, which another
CPU moves in its 7th digit), or on the mean over the seeds (a metric whose every seed is a fresh draw
on another CPU: flip-flop accuracy after 200 steps, docs/leaderboard.md); each value equal (bit for
bit), within the tolerance, or not."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from posenc.leaderboard.data import Row
from posenc.leaderboard.protocol import MEAN, Protocol, Tolerance

EXACT, WITHIN, DIFFERENT = "exact", "within tolerance", "different"
DRAW = "a draw: the mean is judged"  # a seed's value of a metric judged on the mean


@dataclass(frozen=True)
class SeedMatch:
    metric: str
    seed: int | None    # None: the mean over the seeds
    shipped: float | None
    rerun: float | None
    verdict: str        # EXACT | WITHIN | DIFFERENT, or DRAW for a seed of a metric judged on the mean


def verdict(shipped: float | None, rerun: float | None, tolerance: Tolerance) -> str:
    if shipped is None or rerun is None:
        return EXACT if shipped is None and rerun is None else DIFFERENT
    if shipped == rerun:
        return EXACT
    gap = abs(rerun - shipped) / abs(shipped) if tolerance.relative and shipped else abs(rerun - shipped)
    return WITHIN if gap <= tolerance.value else DIFFERENT


def seed_verdict(shipped: float | None, rerun: float | None, metric: str, protocol: Protocol) -> str:
    """One value against the shipped one, under the metric's tolerance."""
    return verdict(shipped, rerun, protocol.tolerance_of(metric))


def mean_of(values: list[float | None]) -> float | None:
    """The mean over seeds; None when a seed has no value (learned positions past their table)."""
    return None if not values or any(v is None for v in values) else fmean(values)


def match(shipped: Row, rerun: Row, protocol: Protocol) -> list[SeedMatch]:
    out = []
    for metric in protocol.metrics:
        tolerance = protocol.tolerance_of(metric)
        old, new = shipped.values.get(metric, []), rerun.values.get(metric, [])
        pairs = [(old[i] if i < len(old) else None, new[i] if i < len(new) else None)
                 for i in range(len(protocol.seeds))]
        for seed, (a, b) in zip(protocol.seeds, pairs):
            out.append(SeedMatch(metric, seed, a, b, DRAW if tolerance.over == MEAN else verdict(a, b, tolerance)))
        if tolerance.over == MEAN:
            a, b = mean_of([a for a, _ in pairs]), mean_of([b for _, b in pairs])
            out.append(SeedMatch(metric, None, a, b, verdict(a, b, tolerance)))
    return out


def overall(matches: list[SeedMatch]) -> str:
    """EXACT when every judged value is, DIFFERENT when any is, else WITHIN."""
    verdicts = {m.verdict for m in matches if m.verdict != DRAW}
    return DIFFERENT if DIFFERENT in verdicts else WITHIN if WITHIN in verdicts else EXACT
