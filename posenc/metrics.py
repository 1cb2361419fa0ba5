"""Every metric posenc writes, declared once; and convergence, computed once.

A declaration says what a metric is called (the same key in metrics.jsonl, summary.json and
W&B), its unit, whether it is a *history* (a value per log step: metrics.jsonl rows, W&B
charts against ``tokens``) or a *summary* (one value per run: summary.json), and whether a
lower or a higher value is better. The trainer writes these names, the Tracker tells W&B how
to summarise them, and the report reads their directions (which value is best) and units
(plot labels) from here. A name with a ``{placeholder}`` is a family: ``extrapolation/ppl@512``
is ``EXTRAPOLATION_PPL.key(length=512)``.

Convergence ("rotary converges faster than learned", EleutherAI 2021) is a statement about
the validation curve loss(tokens); two summary numbers make it comparable across runs:

- ``convergence/tokens_to_loss@x`` (and ``seconds_to_loss@x``): the first evaluation at
  which val/loss <= x; null when the run never got there.
- ``convergence/val_loss_auc``: the area under loss(tokens) (trapezoid rule) divided by the
  token span it covers, i.e. the token-weighted mean validation loss over training, in
  nats. Lower means the loss came down earlier; runs with the same eval schedule compare
  directly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Better = Literal["lower", "higher"] | None

#: the x-axis of every history metric (W&B's step_metric), and a column of every row
TOKENS = "tokens"
STEP = "step"


@dataclass(frozen=True)
class Metric:
    name: str              # key in metrics.jsonl / summary.json / W&B; may hold one {placeholder}
    unit: str              # for tables and plot labels; "" for a pure number
    history: bool          # logged per log step (True) or once per run in summary.json (False)
    better: Better         # which direction is an improvement; None for settings and counters
    description: str

    @property
    def lower_is_better(self) -> bool:
        return self.better != "higher"

    @property
    def _pattern(self) -> re.Pattern:
        parts = re.split(r"\{(\w+)\}", self.name)  # literal, placeholder, literal, ...
        return re.compile("^" + "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)"
                                        for i, p in enumerate(parts)) + "$")

    def key(self, **params: float) -> str:
        """The concrete key: ``TOKENS_TO_LOSS.key(target=2.5)`` -> 'convergence/tokens_to_loss@2.5'."""
        return self.name.format(**{k: f"{v:g}" if isinstance(v, float) else v for k, v in params.items()})

    def match(self, key: str) -> dict[str, str] | None:
        """The placeholders of a concrete key of this metric ({} for a plain name), or None."""
        m = self._pattern.match(key)
        return m.groupdict() if m else None

    @property
    def wandb_name(self) -> str:
        """The name for W&B's define_metric: a family becomes a glob."""
        return re.sub(r"\{\w+\}", "*", self.name)

    @property
    def wandb_summary(self) -> str | None:
        """W&B's summary of a history metric: its last value and its best one."""
        if not self.history or self.better is None:
            return None
        return f"last,{'min' if self.better == 'lower' else 'max'}"

    def label(self) -> str:
        """For an axis: 'val/loss (nats/token)'."""
        return f"{self.name} ({self.unit})" if self.unit else self.name


# --- training (history) ------------------------------------------------------------------
TRAIN_LOSS = Metric("train/loss", "nats/token", True, "lower", "mean next-token cross-entropy of the step's batches")
TRAIN_LR = Metric("train/lr", "", True, None, "learning rate of the step (warmup, then cosine)")
TRAIN_GRAD_NORM = Metric("train/grad_norm", "", True, None, "global gradient norm before clipping")
TRAIN_TOKENS_PER_S = Metric("train/tokens_per_s", "tokens/s", True, "higher", "training throughput since the last log step")
TRAIN_MFU = Metric("train/mfu", "", True, "higher", "model FLOPs utilisation: tokens/s · FLOPs/token / peak FLOP/s")
ELAPSED = Metric("elapsed_s", "s", True, None, "seconds of training so far (a resumed run continues its clock)")
# --- validation (history, and the last value in the summary) --------------------------------
VAL_LOSS = Metric("val/loss", "nats/token", True, "lower", "mean next-token cross-entropy on the fixed validation windows")
VAL_PPL = Metric("val/ppl", "", True, "lower", "perplexity e^val/loss")
VAL_BPB = Metric("val/bpb", "bits/byte", True, "lower", "bits per byte: val/loss / ln 2 / bytes per token")
EXTRAPOLATION_PPL = Metric("extrapolation/ppl@{length}", "", True, "lower",
                           "perplexity at an evaluation length (tokens), the same validation tokens at every length")
# --- synthetic tasks (dataset=synthetic; summary: once, at the end of training) ------------------
TASK_ACCURACY = Metric("tasks/{task}/accuracy@{length}", "", False, "higher",
                       "exact-match accuracy on the task's evaluation instances at a length (tokens); null: not applicable")
TASK_LOW = Metric("tasks/{task}/low@{length}", "", False, None, "lower bound of accuracy's 95% Wilson interval")
TASK_HIGH = Metric("tasks/{task}/high@{length}", "", False, None, "upper bound of accuracy's 95% Wilson interval")
TASK_TOKEN_ACCURACY = Metric("tasks/{task}/token_accuracy@{length}", "", False, "higher",
                             "fraction of answer tokens predicted right at a length (tokens)")
# --- convergence (summary) -----------------------------------------------------------------
TOKENS_TO_LOSS = Metric("convergence/tokens_to_loss@{target}", "tokens", False, "lower",
                        "tokens until val/loss first <= target; null: never")
SECONDS_TO_LOSS = Metric("convergence/seconds_to_loss@{target}", "s", False, "lower",
                         "seconds of training until val/loss first <= target; null: never")
VAL_LOSS_AUC = Metric("convergence/val_loss_auc", "nats/token", False, "lower",
                      "area under val/loss(tokens) / token span: the token-weighted mean val/loss")
# --- the run (summary) ---------------------------------------------------------------------
TOKENS_PER_S = Metric("tokens_per_s", "tokens/s", False, "higher", "tokens / seconds of the training loop")
WALL_TIME = Metric("wall_time_s", "s", False, None, "seconds from start to summary, setup and evaluation included")
PARAMS = Metric("params", "", False, None, "parameters of the model")
STEPS = Metric("steps", "", False, None, "optimizer steps taken")
TOKENS_SEEN = Metric("tokens", "tokens", False, None, "training tokens seen")

METRICS: tuple[Metric, ...] = (
    TRAIN_LOSS, TRAIN_LR, TRAIN_GRAD_NORM, TRAIN_TOKENS_PER_S, TRAIN_MFU, ELAPSED,
    VAL_LOSS, VAL_PPL, VAL_BPB, EXTRAPOLATION_PPL,
    TASK_ACCURACY, TASK_LOW, TASK_HIGH, TASK_TOKEN_ACCURACY,
    TOKENS_TO_LOSS, SECONDS_TO_LOSS, VAL_LOSS_AUC,
    TOKENS_PER_S, WALL_TIME, PARAMS, STEPS, TOKENS_SEEN,
)


def lookup(key: str) -> Metric | None:
    """The declaration a concrete key belongs to ('val/ppl', 'extrapolation/ppl@512'), or None."""
    return next((m for m in METRICS if m.match(key) is not None), None)


# --- convergence ---------------------------------------------------------------------------
#: targets for the byte-level tiny model: unigram bytes sit near 3.3 nats, and a few hundred
#: steps of the tiny model reach ~1.5-2
DEFAULT_TARGETS: tuple[float, ...] = (2.5, 2.25, 2.0, 1.75)

Curve = Sequence[tuple[int, float, float | None]]  # (tokens, val/loss, elapsed_s)


def val_curve(rows: Iterable[dict]) -> list[tuple[int, float, float | None]]:
    """(tokens, val/loss, elapsed_s) of every metrics row that carries a finite val/loss."""
    curve = []
    for row in rows:
        loss = row.get(VAL_LOSS.name)
        if loss is not None and loss == loss:
            curve.append((int(row[TOKENS]), float(loss), row.get(ELAPSED.name)))
    return sorted(curve, key=lambda point: point[0])


def first_reaching(curve: Curve, target: float) -> tuple[int, float | None] | None:
    """(tokens, seconds) of the first evaluation with loss <= target, or None."""
    for tokens, loss, seconds in curve:
        if loss <= target:
            return tokens, seconds
    return None


def loss_auc(curve: Curve) -> float | None:
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
        out[TOKENS_TO_LOSS.key(target=float(target))] = reached[0] if reached else None
        out[SECONDS_TO_LOSS.key(target=float(target))] = reached[1] if reached else None
    out[VAL_LOSS_AUC.name] = loss_auc(curve)
    return out


def elapsed_before(rows: Iterable[dict], step: int) -> float:
    """Training seconds already spent up to `step` (a resumed run's clock continues from it)."""
    return max((row[ELAPSED.name] for row in rows if row.get(ELAPSED.name) is not None and row[STEP] <= step),
               default=0.0)
