"""`posenc compare`: runs on disk -> a table in the terminal, PNG plots, report.md/report.html.

Fully offline: everything is read from the run directories (no W&B). Groups are the
combinations of the swept keys (auto-detected from the runs' overrides, or --by); seeds are
aggregated as the mean with its 95% t-interval. Failed and unfinished runs are listed, never
averaged in; a (config, seed) run twice is counted once. --baseline adds each group's
difference to one group with a verdict; --within ranks the groups per value of another key.
A mistaken --by, --metric, --baseline or --within is refused before anything is written.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from posenc.errors import UserError
from posenc.metrics import (DEFAULT_TARGETS, EXTRAPOLATION_PPL, TASK_ACCURACY, TOKENS_PER_S, VAL_BPB, VAL_LOSS, VAL_LOSS_AUC,
                            VAL_PPL, Target, convergence_metrics, lookup, parse_target, target_of)
from posenc.report.document import Document, write_html, write_markdown
from posenc.report.plots import plot_convergence, plot_final, plot_tokens_to_target
from posenc.report.plots_length import plot_extrapolation, plot_task_accuracy, task_names
from posenc.report.runs import (Group, Run, Stat, aggregate, check_choice, deduplicate, find_runs, format_value,
                                group_keys, group_runs, varying_keys)
from posenc.report.setup import describe, describe_varied, setup_line, setup_split
from posenc.report.tables import rich_table, text_tables
from posenc.report.verdicts import Ranked, Versus, baseline_table, find_baseline, rank_within, same_order
from posenc.rundir import read_sweep


@dataclass(frozen=True)
class Column:
    key: str              # the summary key
    header: str
    fmt: str              # "loss" | "ppl" | "tokens" | "rate" | "accuracy"

    @property
    def lower_is_better(self) -> bool:
        """From the metric's declaration (posenc.metrics); an undeclared key: lower."""
        metric = lookup(self.key)
        return metric is None or metric.lower_is_better


BASE_COLUMNS = [
    Column(VAL_LOSS.name, VAL_LOSS.name, "loss"),
    Column(VAL_PPL.name, VAL_PPL.name, "ppl"),
    Column(VAL_BPB.name, VAL_BPB.name, "loss"),
    Column(VAL_LOSS_AUC.name, "AUC", "loss"),
]
RATE_COLUMN = Column(TOKENS_PER_S.name, "tokens/s", "rate")


def convergence_targets(runs: Sequence[Run], asked: Sequence[float | str] | None) -> list[Target]:
    """--target values (2.5: val/loss; 1.2bpb: val/bpb), else the targets the runs were
    trained with, else the defaults; val/loss targets first, each kind highest first."""
    try:
        wanted = [parse_target(t) for t in asked or []]
    except ValueError as e:
        raise UserError(f"--target: {e}") from None
    found = {t for r in runs if r.ok for k in r.summary if (t := target_of(k)) is not None}
    chosen = set(wanted or found or [Target(t) for t in DEFAULT_TARGETS])
    return sorted(chosen, key=lambda t: (t.bpb, -t.value))


def metric_keys(runs: Sequence[Run]) -> list[str]:
    """The summary keys --metric accepts: numbers (or null: never reached) in a finished run."""
    return sorted({k for r in runs if r.ok for k, v in r.summary.items()
                   if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))})


def columns_for(runs: Sequence[Run], metric: str, targets: Sequence[Target]) -> list[Column]:
    """The table's columns: quality, convergence (one per target), extrapolation, speed."""
    keys = {k for r in runs if r.ok for k in r.summary}
    cols = [c for c in BASE_COLUMNS if c.key in keys]
    cols += [Column(t.tokens_key, f"→{t}", "tokens") for t in targets]
    cols += [Column(k, f"ppl@{EXTRAPOLATION_PPL.match(k)['length']}", "ppl")
             for k in sorted(keys, key=_length_order) if EXTRAPOLATION_PPL.match(k)]
    # dataset=synthetic: exact-match accuracy at each evaluated length (null there: not applicable)
    cols += [Column(k, f"{m['task']} acc@{m['length']}", "accuracy")
             for k in sorted(keys, key=_length_order) if (m := TASK_ACCURACY.match(k))]
    if metric not in {c.key for c in cols} and metric in keys:
        cols.insert(0, Column(metric, metric, "loss"))
    if RATE_COLUMN.key in keys:
        cols.append(RATE_COLUMN)
    return cols


def _length_order(key: str) -> tuple:
    digits = re.findall(r"\d+", key)
    return (key.split("@")[0], int(digits[-1]) if digits else 0)


@dataclass
class Comparison:
    by: list[str]
    groups: list[Group]
    columns: list[Column]
    targets: list[Target]
    cells: dict[tuple[str, str], Stat]   # (group label, column key) -> stat
    best: dict[str, float]               # column key -> best mean
    metric: str = VAL_PPL.name           # the headline metric: plotted, compared to the baseline, ranked
    runs: list[Run] = field(default_factory=list)
    duplicates: list[tuple[Run, list[Run]]] = field(default_factory=list)   # (kept, dropped)
    fixed: dict = field(default_factory=dict)      # config key -> the value every run shared
    varied: dict = field(default_factory=dict)     # config key -> its distinct values
    baseline: Group | None = None
    versus: dict[str, Versus] = field(default_factory=dict)           # group label -> against the baseline
    within: str | None = None
    rankings: dict[str, list[Ranked]] = field(default_factory=dict)   # within-value -> ranked groups

    @property
    def failed(self) -> list[Run]:
        return [r for g in self.groups for r in g.failed]

    @property
    def metric_fmt(self) -> str:
        return next((col.fmt for col in self.columns if col.key == self.metric), "loss")


def default_metric(runs: Sequence[Run]) -> str:
    """val/ppl, else val/loss, else the first numeric summary key: a comparison always has one."""
    keys = metric_keys(runs)
    return next((m for m in (VAL_PPL.name, VAL_LOSS.name) if m in keys), keys[0] if keys else VAL_PPL.name)


def build_comparison(runs: Sequence[Run], by: Sequence[str] | None, metric: str | None = None,
                     targets: Sequence[float | str] | None = None, baseline: str | None = None,
                     within: str | None = None) -> Comparison:
    """The whole comparison, computed before anything is written, so a mistaken option is
    refused (UserError naming the valid choices) with nothing on disk."""
    runs, duplicates = deduplicate(runs)
    valid = group_keys(runs)
    for key in (by or []):
        check_choice("--by key", key, valid)
    if within is not None:
        check_choice("--within key", within, valid)
    by = list(by) if by else [k for k in varying_keys(runs) if k != within]
    targets = convergence_targets(runs, targets)
    for run in runs:
        # convergence is the run's own (summary.json); targets it was not trained with come from
        # its metrics.jsonl through the same function
        missing = [t for t in targets if t.tokens_key not in (run.summary or {})]
        if run.ok and (missing or VAL_LOSS_AUC.name not in run.summary):
            for key, value in convergence_metrics(run.rows, missing).items():
                run.summary.setdefault(key, value)
    if metric is None:
        metric = default_metric(runs)
    else:
        check_choice("--metric", metric, metric_keys(runs))
    groups = group_runs(runs, by)
    columns = columns_for(runs, metric, targets)
    cells, best = {}, {}
    for col in columns:
        for g in groups:
            stat = aggregate(g.values(col.key)) if g.completed else Stat(None, None, 0, 0)
            cells[(g.label, col.key)] = stat
            if stat.mean is not None:
                better = min if col.lower_is_better else max
                best[col.key] = better(best.get(col.key, stat.mean), stat.mean)
    fixed, varied = setup_split(runs)
    c = Comparison(by, groups, columns, targets, cells, best, metric, list(runs), duplicates, fixed, varied)
    if baseline is not None:
        c.baseline = find_baseline(groups, baseline)
        c.versus = baseline_table(groups, c.baseline, metric)
    if within is not None:
        c.within, c.rankings = within, rank_within(runs, by, within, metric)
    return c


def failed_lines(c: Comparison, root: Path) -> list[str]:
    out = []
    for run in c.failed:
        error = run.metric("error") or ("no summary.json: still running or killed" if run.status == "unfinished" else "")
        out.append(f"{_relative(run.path, root)}: {run.status}" + (f" — {error}" if error else ""))
    return out


def duplicate_lines(c: Comparison, root: Path) -> list[str]:
    return [f"duplicate runs (same config, seed {format_value(kept.seed)}): "
            f"{', '.join(_relative(r.path, root) for r in [kept, *dropped])} — counted once, keeping "
            f"{_relative(kept.path, root)}" for kept, dropped in c.duplicates]


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def default_out(paths: Sequence[Path]) -> Path:
    """One run or sweep (or folder) given: write there, next to its data. Several: a new folder."""
    if len(paths) == 1:
        return Path(paths[0])
    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d/%H-%M-%S")


def compare(paths: Sequence[Path], by: Sequence[str] | None = None, metric: str | None = None,
            out: Path | None = None, targets: Sequence[float | str] | None = None, console: Console | None = None,
            baseline: str | None = None, within: str | None = None) -> Path:
    """Compare the runs under paths; print the tables; write plots and reports into out."""
    console = console or Console()
    runs = find_runs(paths)
    c = build_comparison(runs, by, metric, targets, baseline, within)  # refuses mistakes: nothing written yet
    out = Path(out) if out else default_out(paths)
    out.mkdir(parents=True, exist_ok=True)
    sweep = read_sweep(Path(paths[0])) if len(paths) == 1 else None
    title = f"{sweep['name'] if sweep else 'comparison'}: {len(c.runs)} runs"
    by_text = ", ".join(c.by) or "nothing varies"
    setup = setup_line(c.runs)

    for line in duplicate_lines(c, out):
        console.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False)
    console.print(f"[bold]{escape(title)}[/], grouped by {escape(by_text)} · {escape(setup)}", highlight=False)
    console.print(f"[dim]varied:[/] {escape(describe_varied(c.varied) or 'nothing')}", highlight=False)
    console.print(f"[dim]held fixed:[/] {escape(describe(c.fixed) or 'nothing')}", highlight=False)
    for table in text_tables(c, compact=True):
        console.print(rich_table(table))
    failed = failed_lines(c, out)
    for line in failed:
        console.print(f"[bold red]not averaged in:[/] {escape(line)}", highlight=False)
    if c.rankings:
        holds = same_order(c.rankings)
        console.print(f"ranking by {c.metric} across {c.within}: "
                      + ("[green]the same order for every value[/]" if holds else "[yellow]the order changes[/]"))

    plots = [
        plot_convergence(c.groups, out / "convergence.png", f"Validation loss, {title}", c.targets, setup),
        plot_final(c.groups, c.by, c.metric, out / f"final_{re.sub(r'[^A-Za-z0-9@.]+', '_', c.metric)}.png",
                   f"Final {c.metric} by {by_text}", setup),
        plot_tokens_to_target(c.groups, c.targets, out / "tokens_to_loss.png", "Tokens to reach a target", setup),
    ]
    if any(EXTRAPOLATION_PPL.match(col.key) for col in c.columns):  # some finished run was evaluated at other lengths
        plots.append(plot_extrapolation(c.groups, out / "extrapolation.png", f"Perplexity against length, {title}", setup))
    for task in task_names(c.groups):  # some finished run was a synthetic task scored at several lengths
        plots.append(plot_task_accuracy(c.groups, task, out / f"accuracy_{task}.png",
                                        f"{task} accuracy against length, {title}", setup))
    notes = [NOTES] + ([f"ranking by {c.metric} across {c.within}: "
                        + ("the same order for every value" if same_order(c.rankings) else "the order changes")]
                       if c.rankings else [])
    doc = Document(title, setup, sweep, describe_varied(c.varied), describe(c.fixed), text_tables(c), notes, failed,
                   duplicate_lines(c, out), plots)
    write_markdown(out / "report.md", doc)
    write_html(out / "report.html", doc)
    console.print(f"report: [bold]{out / 'report.html'}[/] (and report.md, {', '.join(p.name for p in plots)})")
    return out


NOTES = ("Each cell: the mean over seeds and its 95% t-interval [low, high] (one seed: the value alone, "
         "no interval). Best mean per column in bold. "
         "→x: tokens until val/loss reaches x (→xbpb: val/bpb reaches x bits/byte), interpolated between the two "
         "evaluations that bracket x (—: never; k/n seeds: only k got there, so no mean). "
         "AUC: area under val/loss(tokens) / token span = token-weighted mean val/loss (lower = faster). "
         "Against a baseline: group − baseline with Welch's 95% interval; 'better'/'worse' only when the interval "
         "excludes 0.")
