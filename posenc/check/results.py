"""What a check returns: one typed row per property; the tolerances rows share.

A row that compares two computations which should agree up to rounding allows what rounding
gives in the dtype the code computes in (``rounding_bound``): a value computed in a dtype of
machine epsilon ε carries a relative error of a few ε, and a position m (or an angle m·θ, θ ≤ 1)
held in float32 — positions and angles are computed in float32 at least, as torchtitan and Hugging
Face compute RoPE's — an absolute error of ε_float32·m. So at positions up to m the relative error
may reach ROUNDING · (ε + ε_float32 · m): in float64 at the check's 61 positions 2.9e-5, in bf16 at
position 4096 3.3e-2.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

#: float64 logits that should be equal are equal to this (they differ by reassociation alone)
EXACT = 1e-10
#: how many times the rounding of its dtype a measured relative error may reach (``rounding_bound``)
ROUNDING = 4


def rounding_bound(dtype: torch.dtype, position: int = 0) -> float:
    """The relative error rounding alone gives a value computed in dtype from positions up to
    ``position``, positions and angles in float32 at least: ROUNDING · (ε_dtype + ε_float32 · position)."""
    return ROUNDING * (torch.finfo(dtype).eps + torch.finfo(torch.float32).eps * position)


class Status(enum.Enum):
    PASS = "✓"
    FAIL = "✗"
    NOT_OFFERED = "—"


@dataclass(frozen=True)
class CheckResult:
    """One property of one encoding: whether it holds, the number measured, why where it does not hold
    or does not apply (``note``), and a qualification where it holds with one (``caveat``)."""

    name: str
    status: Status
    measured: str
    note: str = ""
    #: what holds only with a qualification a user must know (a cache that goes stale beyond a length),
    #: carried beside the verdict to the leaderboard's table
    caveat: str = ""

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL


def holds(name: str, ok: bool, measured: str, note: str = "") -> CheckResult:
    """A row that passes when ok (the note says what failing means, shown on a ✗ only)."""
    return CheckResult(name, Status.PASS if ok else Status.FAIL, measured, "" if ok else note)


@dataclass(frozen=True)
class Measured:
    """A property measured in one mode: whether it holds, the number, and what differed where it
    does not (``note``)."""

    ok: bool
    measured: str
    note: str = ""


def in_modes(name: str, modes: dict[str, Measured], names: dict[str, str]) -> CheckResult:
    """One row of a property measured in several modes (``eval``, ``train``): it holds where it
    holds in each; ``measured`` says each mode's number, and a ✗'s note starts with the mode that
    failed (names: how a note names each mode)."""
    ok = all(m.ok for m in modes.values())
    measured = "; ".join(f"{mode} {m.measured}" for mode, m in modes.items())
    failed: dict[str, list[str]] = {}  # one note said once, naming every mode it holds for
    for mode, m in modes.items():
        if not m.ok:
            failed.setdefault(m.note, []).append(names[mode])
    note = "; ".join(f"in {' and in '.join(where)}: {text}" for text, where in failed.items())
    return CheckResult(name, Status.PASS if ok else Status.FAIL, measured, note)


def not_offered(name: str, why: str) -> CheckResult:
    return CheckResult(name, Status.NOT_OFFERED, "", f"not offered: {why}")


def raised(name: str, e: Exception) -> CheckResult:
    """A ✗ row naming the exception a property's code raised: its first telling line (a compile
    error's cause, not dynamo's "backend='inductor' raised:" that precedes it)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and not line.strip().endswith("raised:")]
    return CheckResult(name, Status.FAIL, "raised", f"{type(e).__name__}: {lines[0] if lines else ''}"[:300])


def max_abs(a, b) -> float:
    """max |a - b| over two tensors of one shape, as a float (0 for empty tensors)."""
    diff = (a.detach().double() - b.detach().double()).abs()
    return float(diff.max()) if diff.numel() else 0.0
