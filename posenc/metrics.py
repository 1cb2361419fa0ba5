"""Convergence: how fast a run's validation loss comes down, as numbers in its summary.

"Rotary converges faster than learned" (EleutherAI, 2021) is a statement about the
validation curve loss(tokens). Two numbers make it comparable across runs:

- ``convergence/tokens_to_loss@x`` (and ``seconds_to_loss@x``): the first evaluation at
  which val/loss <= x; null when the run never got there.
- ``convergence/val_loss_auc``: the area under loss(tokens) (trapezoid rule) divided by the
  token span it covers, i.e. the token-weighted mean validation loss over training, in
  nats. Lower means the loss came down earlier; runs with the same eval schedule compare
  directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: targets for the byte-level tiny model: unigram bytes sit near 3.3 nats, and a few hundred
#: steps of the tiny model reach ~1.5-2
DEFAULT_TARGETS: tuple[float, ...] = (2.5, 2.25, 2.0, 1.75)


def target_key(target: float, unit: str = "tokens") -> str:
    return f"convergence/{unit}_to_loss@{target:g}"


def val_curve(rows: Iterable[dict]) -> list[tuple[int, float, float | None]]:
    """(tokens, val/loss, elapsed_s) of every metrics row that carries a finite val/loss."""
    curve = []
    for row in rows:
        loss = row.get("val/loss")
        if loss is not None and loss == loss:
            curve.append((int(row["tokens"]), float(loss), row.get("elapsed_s")))
    return sorted(curve, key=lambda point: point[0])


def first_reaching(curve: Sequence[tuple[int, float, float | None]], target: float) -> tuple[int, float | None] | None:
    """(tokens, seconds) of the first evaluation with loss <= target, or None."""
    for tokens, loss, seconds in curve:
        if loss <= target:
            return tokens, seconds
    return None


def loss_auc(curve: Sequence[tuple[int, float, float | None]]) -> float | None:
    """Trapezoid area under loss(tokens) over the covered token span, / that span (nats).
    A single evaluation has no span: its loss is the mean."""
    if not curve:
        return None
    if len(curve) == 1:
        return curve[0][1]
    area = sum((t1 - t0) * (l0 + l1) / 2 for (t0, l0, _), (t1, l1, _) in zip(curve, curve[1:]))
    return area / (curve[-1][0] - curve[0][0])


def convergence_metrics(rows: Iterable[dict], targets: Sequence[float] | None = None) -> dict[str, float | int | None]:
    """The convergence/* summary keys from a run's metrics rows (see module docstring)."""
    curve = val_curve(rows)
    out: dict[str, float | int | None] = {}
    for target in targets if targets is not None else DEFAULT_TARGETS:
        reached = first_reaching(curve, float(target))
        out[target_key(target)] = reached[0] if reached else None
        out[target_key(target, "seconds")] = reached[1] if reached else None
    out["convergence/val_loss_auc"] = loss_auc(curve)
    return out


def elapsed_before(rows: Iterable[dict], step: int) -> float:
    """Training seconds already spent up to `step` (a resumed run's clock continues from it)."""
    return max((row["elapsed_s"] for row in rows if row.get("elapsed_s") is not None and row["step"] <= step),
               default=0.0)
