"""What `posenc compare` computed, as data: the columns, each group's cells, who leads each column,
the ranking, and what the renderers (report/tables.py, report/plots*.py) read from it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from posenc.record.metrics import (
    EXTRAPOLATION_PPL,
    TASK_ACCURACY,
    TOKENS_PER_S,
    TRAIN_MFU,
    VAL_BPB,
    VAL_LOSS,
    VAL_LOSS_AUC,
    VAL_PPL,
    Target,
    lookup,
)
from posenc.report.ranking import Agreement, Leader, Ranking
from posenc.report.runs import Group, Run
from posenc.report.stats import Stat
from posenc.report.verdicts import Versus

#: the columns whose values are timings: each run timed once while it trained, never emphasised
COST_KEYS = (TOKENS_PER_S.name, TRAIN_MFU.name)


@dataclass(frozen=True)
class Column:
    key: str              # the summary key
    header: str
    fmt: str              # "loss" | "ppl" | "tokens" | "rate" | "accuracy"

    @property
    def lower_is_better(self) -> bool:
        """From the metric's declaration (posenc.record.metrics); an undeclared key: lower."""
        metric = lookup(self.key)
        return metric is None or metric.lower_is_better

    @property
    def cost(self) -> bool:
        return self.key in COST_KEYS


BASE_COLUMNS = [
    Column(VAL_LOSS.name, VAL_LOSS.name, "loss"),
    Column(VAL_PPL.name, VAL_PPL.name, "ppl"),
    Column(VAL_BPB.name, VAL_BPB.name, "loss"),
    Column(VAL_LOSS_AUC.name, "AUC", "loss"),
]
COST_COLUMNS = [Column(TOKENS_PER_S.name, "tokens/s", "rate"), Column(TRAIN_MFU.name, "MFU", "accuracy")]


def is_task_run(keys: set[str]) -> bool:
    """dataset=synthetic: the summary holds exact-match accuracy by length, the run's main result."""
    return any(TASK_ACCURACY.match(k) for k in keys)


def length_order(key: str) -> tuple:
    digits = re.findall(r"\d+", key)
    return (key.split("@")[0], int(digits[-1]) if digits else 0)


def columns_for(runs: Sequence[Run], metric: str, targets: Sequence[Target]) -> list[Column]:
    """The table's columns: task accuracy first on a task run, then quality, convergence (one per
    target), extrapolation, cost. A task run leaves out val/ppl and val/bpb: the loss over answer
    tokens alone is no language-modelling perplexity."""
    keys = {k for r in runs if r.ok for k in r.summary}
    task = is_task_run(keys)
    cols = [Column(k, f"{m['task']} acc@{m['length']}", "accuracy")
            for k in sorted(keys, key=length_order) if (m := TASK_ACCURACY.match(k))]
    cols += [c for c in BASE_COLUMNS if c.key in keys and not (task and c.key in (VAL_PPL.name, VAL_BPB.name))]
    cols += [Column(t.tokens_key, f"→{t}", "tokens") for t in targets]
    cols += [Column(k, f"ppl@{EXTRAPOLATION_PPL.match(k)['length']}", "ppl")
             for k in sorted(keys, key=length_order) if EXTRAPOLATION_PPL.match(k)]
    if metric not in {c.key for c in cols} and metric in keys and metric not in COST_KEYS:
        cols.insert(0, Column(metric, metric, "loss"))
    return cols + [c for c in COST_COLUMNS if c.key in keys]


@dataclass
class Comparison:
    by: list[str]                        # what is compared (and ranked): the groups' keys but --within
    groups: list[Group]                  # one per value of `keys`: a cell never pools two values of --within
    columns: list[Column]
    targets: list[Target]
    cells: dict[tuple[str, str], Stat]   # (group label, column key) -> stat
    leaders: dict[str, Leader]           # column key -> the best group where detectable, else the tied ones
    metric: str = VAL_PPL.name           # the headline metric: plotted, ranked, compared to the baseline
    runs: list[Run] = field(default_factory=list)
    duplicates: list[tuple[Run, list[Run]]] = field(default_factory=list)   # (kept, dropped)
    fixed: dict = field(default_factory=dict)      # config key -> the value every run shared
    varied: dict = field(default_factory=dict)     # config key -> its distinct values
    early: dict[tuple[str, str], int] = field(default_factory=dict)  # (label, tokens-to key) -> seeds already there at the first eval
    dropped_targets: list[Target] = field(default_factory=list)      # targets no run's loss crossed
    baseline: Group | None = None
    versus: dict[str, Versus] = field(default_factory=dict)          # group label -> against the baseline
    ranking: Ranking | None = None                                    # the groups on the headline metric
    within: str | None = None
    rankings: dict[str, Ranking] = field(default_factory=dict)       # within-value -> the groups ranked there
    agreements: list[Agreement] = field(default_factory=list)        # Kendall τ between within-values
    unchecked: list[str] = field(default_factory=list)               # a line per arm failing `posenc check`
    unproved: list[str] = field(default_factory=list)                # a line per arm whose checkpoints do not rebuild its model
    #: the options that make this report other than a plain compare's, as they name its files
    #: ('metric' -> 'extrapolation/ppl@1024', 'by', 'within', 'baseline', 'targets'): report/write.py
    chosen: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Run]:
        return [r for g in self.groups for r in g.failed]

    @property
    def metric_fmt(self) -> str:
        return next((col.fmt for col in self.columns if col.key == self.metric), "loss")

    @property
    def keys(self) -> list[str]:
        """The keys the table's groups are made of: by, and the --within key."""
        return self.by + ([self.within] if self.within else [])

    @property
    def group_header(self) -> str:
        return ", ".join(self.keys) or "group"
