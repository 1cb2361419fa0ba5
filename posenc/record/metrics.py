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

- ``convergence/tokens_to_loss@x`` (and ``seconds_to_loss@x``): where val/loss first
  reaches x, interpolated linearly between the two evaluations that bracket x (the last one
  above it and the first one at or below it), not the first evaluation past it: with an eval
  every 50 steps, "first point past" would round every run up to a multiple of 50 steps and
  hide differences smaller than the eval interval. Null when the run never got there.
- ``convergence/tokens_to_bpb@x`` (and ``seconds_to_bpb@x``): the same on val/bpb, a target in
  bits per byte, so one target means the same thing for every tokenizer (`--target 1.2bpb`).
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
#: how seeds of a metric are averaged and given an interval (posenc/report/stats.py): "linear" (the
#: t-interval of the mean) or "log" for positive, multiplicative metrics (perplexity = e^loss, token
#: counts, rates), whose interval is the loss-scale one mapped back with exp, so it is never negative
Scale = Literal["linear", "log"]

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
    scale: Scale = "linear"
    bounds: tuple[float | None, float | None] = (None, None)  # the values it can take: an interval is clipped to them

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
        """The name for W&B's define_metric: a family becomes a glob of what precedes its first
        placeholder (W&B takes a trailing ``*`` only: ``extrapolation/ppl@*`` for ``…@{multiple}x`` too)."""
        return re.sub(r"\{\w+\}.*$", "*", self.name)

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
TRAIN_LOSS = Metric("train/loss", "nats/token", True, "lower", "mean next-token cross-entropy of the step's batches",
                    bounds=(0, None))
TRAIN_LR = Metric("train/lr", "", True, None, "learning rate of the step (warmup, then cosine)")
TRAIN_GRAD_NORM = Metric("train/grad_norm", "", True, None, "global gradient norm before clipping")
TRAIN_TOKENS_PER_S = Metric("train/tokens_per_s", "tokens/s", True, "higher", "training throughput since the last log step",
                            "log")
TRAIN_MFU = Metric("train/mfu", "", True, "higher", "model FLOPs utilisation: tokens/s · FLOPs/token / peak FLOP/s", "log")
ELAPSED = Metric("elapsed_s", "s", True, None, "seconds of training so far (a resumed run continues its clock)")
# --- validation (history, and the last value in the summary) --------------------------------
VAL_LOSS = Metric("val/loss", "nats/token", True, "lower", "mean next-token cross-entropy on the fixed validation windows",
                  bounds=(0, None))
VAL_PPL = Metric("val/ppl", "", True, "lower", "perplexity e^val/loss", "log")
VAL_BPB = Metric("val/bpb", "bits/byte", True, "lower", "bits per byte: val/loss / ln 2 / bytes per token", bounds=(0, None))
EXTRAPOLATION_PPL = Metric("extrapolation/ppl@{length}", "", True, "lower",
                           "perplexity at an evaluation length (tokens), the same validation tokens at every length", "log")
# the same perplexities keyed by the multiple of trainer.seq_len (metrics.jsonl and W&B only): a key that
# means the same in runs of any training length, for a dashboard's chart across them
EXTRAPOLATION_PPL_MULTIPLE = Metric("extrapolation/ppl@{multiple}x", "", True, "lower",
                                    "perplexity at an evaluation length given as a multiple of the training length", "log")
# --- synthetic tasks (dataset=synthetic; summary: once, at the end of training) ------------------
TASK_ACCURACY = Metric("tasks/{task}/accuracy@{length}", "", False, "higher",
                       "exact-match accuracy on the task's evaluation instances at a length (tokens); null: not applicable",
                       bounds=(0, 1))
TASK_LOW = Metric("tasks/{task}/low@{length}", "", False, None, "lower bound of accuracy's 95% Wilson interval")
TASK_HIGH = Metric("tasks/{task}/high@{length}", "", False, None, "upper bound of accuracy's 95% Wilson interval")
TASK_TOKEN_ACCURACY = Metric("tasks/{task}/token_accuracy@{length}", "", False, "higher",
                             "fraction of answer tokens predicted right at a length (tokens)", bounds=(0, 1))
# --- convergence (summary) -----------------------------------------------------------------
TOKENS_TO_LOSS = Metric("convergence/tokens_to_loss@{target}", "tokens", False, "lower",
                        "tokens until val/loss first reaches target (interpolated between evaluations); null: never", "log")
SECONDS_TO_LOSS = Metric("convergence/seconds_to_loss@{target}", "s", False, "lower",
                         "seconds of training until val/loss first reaches target (interpolated); null: never", "log")
TOKENS_TO_BPB = Metric("convergence/tokens_to_bpb@{target}", "tokens", False, "lower",
                       "tokens until val/bpb first reaches target (interpolated between evaluations); null: never", "log")
SECONDS_TO_BPB = Metric("convergence/seconds_to_bpb@{target}", "s", False, "lower",
                        "seconds of training until val/bpb first reaches target (interpolated); null: never", "log")
# true where the curve was already at or below the target at the first evaluation: tokens_to_*@x is
# then the first evaluation's token count, an upper bound (≤), not a crossing (a censored value)
BEFORE_FIRST_EVAL_LOSS = Metric("convergence/before_first_eval_loss@{target}", "", False, None,
                                "true: val/loss was at or below target at the first evaluation, so "
                                "tokens_to_loss@target is only an upper bound (the first evaluation's tokens)")
BEFORE_FIRST_EVAL_BPB = Metric("convergence/before_first_eval_bpb@{target}", "", False, None,
                               "true: val/bpb was at or below target at the first evaluation, so "
                               "tokens_to_bpb@target is only an upper bound (the first evaluation's tokens)")
VAL_LOSS_AUC = Metric("convergence/val_loss_auc", "nats/token", False, "lower",
                      "area under val/loss(tokens) / token span: the token-weighted mean val/loss", bounds=(0, None))
# --- the run (summary) ---------------------------------------------------------------------
TOKENS_PER_S = Metric("tokens_per_s", "tokens/s", False, "higher", "tokens / seconds of the training loop", "log")
WALL_TIME = Metric("wall_time_s", "s", False, None, "seconds from start to summary, setup and evaluation included", "log")
PARAMS = Metric("params", "", False, None, "parameters of the model")
STEPS = Metric("steps", "", False, None, "optimizer steps taken")
# the x-axis column of every metrics.jsonl row (TOKENS) and the summary's counter are one name
# for one quantity: training tokens seen, by that row's step or by the end of the run
TOKENS_SEEN = Metric(TOKENS, "tokens", False, None, "training tokens seen (every row's x-axis column too)")
# --- the machine while the run trained (summary): timings from a loaded machine are noise -----
MACHINE_LOAD = Metric("machine/load_1m", "", False, None,
                      "os.getloadavg()'s 1-minute load average when the summary was written (runnable threads, all processes)")
MACHINE_CPUS = Metric("machine/cpus", "", False, None, "CPUs this process could run on")
MACHINE_THREADS = Metric("machine/threads", "", False, None,
                         "torch threads each process computed with (posenc.hardware.choose_cpu_threads on a CPU)")
#: timings are flagged when MACHINE_LOAD exceeded this many times MACHINE_CPUS: a run's own threads
#: account for at most 1×, the rest were other processes competing for the CPUs
LOADED_PER_CPU = 1.5

METRICS: tuple[Metric, ...] = (
    TRAIN_LOSS, TRAIN_LR, TRAIN_GRAD_NORM, TRAIN_TOKENS_PER_S, TRAIN_MFU, ELAPSED,
    VAL_LOSS, VAL_PPL, VAL_BPB, EXTRAPOLATION_PPL_MULTIPLE, EXTRAPOLATION_PPL,
    TASK_ACCURACY, TASK_LOW, TASK_HIGH, TASK_TOKEN_ACCURACY,
    TOKENS_TO_LOSS, SECONDS_TO_LOSS, TOKENS_TO_BPB, SECONDS_TO_BPB, BEFORE_FIRST_EVAL_LOSS, BEFORE_FIRST_EVAL_BPB,
    VAL_LOSS_AUC,
    TOKENS_PER_S, WALL_TIME, PARAMS, STEPS, TOKENS_SEEN, MACHINE_LOAD, MACHINE_CPUS, MACHINE_THREADS,
)


def lookup(key: str) -> Metric | None:
    """The declaration a concrete key belongs to ('val/ppl', 'extrapolation/ppl@512'), or None."""
    return next((m for m in METRICS if m.match(key) is not None), None)


# --- convergence ---------------------------------------------------------------------------
#: targets for the byte-level tiny model: unigram bytes sit near 3.3 nats, and a few hundred
#: steps of the tiny model reach ~1.5-2
DEFAULT_TARGETS: tuple[float, ...] = (2.5, 2.25, 2.0, 1.75)

Curve = Sequence[tuple[int, float, float | None]]  # (tokens, value, elapsed_s)


@dataclass(frozen=True)
class Target:
    """A convergence target: a value of val/loss (nats/token) or of val/bpb (bits/byte)."""

    value: float
    bpb: bool = False

    @property
    def curve_metric(self) -> Metric:
        return VAL_BPB if self.bpb else VAL_LOSS

    @property
    def tokens_key(self) -> str:
        return (TOKENS_TO_BPB if self.bpb else TOKENS_TO_LOSS).key(target=self.value)

    @property
    def seconds_key(self) -> str:
        return (SECONDS_TO_BPB if self.bpb else SECONDS_TO_LOSS).key(target=self.value)

    @property
    def first_eval_key(self) -> str:
        """The flag that tokens_key is only a bound: the target was reached before the first evaluation."""
        return (BEFORE_FIRST_EVAL_BPB if self.bpb else BEFORE_FIRST_EVAL_LOSS).key(target=self.value)

    def __str__(self) -> str:
        return f"{self.value:g}" + ("bpb" if self.bpb else "")


def parse_target(text: str | float | Target) -> Target:
    """'2.5' -> val/loss 2.5 nats/token; '1.2bpb' -> val/bpb 1.2 bits/byte."""
    if isinstance(text, Target):
        return text
    raw = str(text).strip().lower()
    bpb = raw.endswith("bpb")
    try:
        value = float(raw.removesuffix("bpb").strip())
    except ValueError:
        raise ValueError(f"target {text!r} is not a number — give val/loss in nats (2.5) or val/bpb "
                         f"with a bpb suffix (1.2bpb)") from None
    return Target(value, bpb)


def target_of(key: str) -> Target | None:
    """The target a tokens-to key was computed for, or None for any other key."""
    for family, bpb in ((TOKENS_TO_LOSS, False), (TOKENS_TO_BPB, True)):
        if (m := family.match(key)) is not None:
            return Target(float(m["target"]), bpb)
    return None


def val_curve(rows: Iterable[dict], metric: str = VAL_LOSS.name) -> list[tuple[int, float, float | None]]:
    """(tokens, value, elapsed_s) of every metrics row that carries a finite value of metric."""
    curve = []
    for row in rows:
        value = row.get(metric)
        if value is not None and value == value:
            curve.append((int(row[TOKENS]), float(value), row.get(ELAPSED.name)))
    return sorted(curve, key=lambda point: point[0])


def _lerp(x0: float, x1: float, fraction: float) -> float:
    return x0 + fraction * (x1 - x0)


def first_reaching(curve: Curve, target: float) -> tuple[float, float | None] | None:
    """(tokens, seconds) at which the curve first reaches target, or None if it never does.

    With (t₀, l₀) the last evaluation above the target and (t₁, l₁) the first at or below it,
    tokens = t₀ + (l₀ - target)/(l₀ - l₁) · (t₁ - t₀), the crossing of the straight line
    between them (seconds likewise). Already at or below at the first evaluation: that point.
    """
    for i, (tokens, value, seconds) in enumerate(curve):
        if value > target:
            continue
        if i == 0:
            return float(tokens), seconds
        t0, v0, s0 = curve[i - 1]
        fraction = (v0 - target) / (v0 - value)  # v0 > target >= value, so 0 < fraction <= 1
        at_seconds = _lerp(s0, seconds, fraction) if s0 is not None and seconds is not None else seconds
        return _lerp(t0, tokens, fraction), at_seconds
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


def convergence_metrics(rows: Iterable[dict], targets: Sequence[float | str | Target] | None = None
                        ) -> dict[str, float | int | None]:
    """The convergence/* summary keys from a run's metrics rows (see module docstring); a
    target is a val/loss value, or a val/bpb one ('1.2bpb' or a Target)."""
    rows = list(rows)
    curves = {m: val_curve(rows, m) for m in (VAL_LOSS.name, VAL_BPB.name)}
    out: dict[str, float | int | None] = {}
    for target in (parse_target(t) for t in (targets if targets is not None else DEFAULT_TARGETS)):
        curve = curves[target.curve_metric.name]
        reached = first_reaching(curve, target.value)
        out[target.tokens_key] = round(reached[0]) if reached else None  # a token count
        out[target.seconds_key] = reached[1] if reached else None
        out[target.first_eval_key] = bool(curve) and curve[0][1] <= target.value  # the count is then only ≤
    out[VAL_LOSS_AUC.name] = loss_auc(curves[VAL_LOSS.name])
    return out


def elapsed_before(rows: Iterable[dict], step: int) -> float:
    """Training seconds already spent up to `step` (a resumed run's clock continues from it)."""
    return max((row[ELAPSED.name] for row in rows if row.get(ELAPSED.name) is not None and row[STEP] <= step),
               default=0.0)
