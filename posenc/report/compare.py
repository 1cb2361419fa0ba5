"""`posenc compare`: runs on disk -> a table in the terminal, PNG plots, report.md/report.html.

Fully offline: everything is read from the run directories (no W&B). Groups are the
combinations of the swept keys (auto-detected from the runs' overrides, or --by); seeds are
aggregated as the mean with its 95% interval on the metric's scale (report/stats.py). Failed and
unfinished runs are listed, never averaged in; a (config, seed) run twice is counted once. The
groups are ranked on the headline metric with rank intervals and a verdict from the same tests (the best
only where detectable); --baseline adds each group's difference to one group; --within ranks the
groups per value of another key and measures how well those rankings agree. A mistaken --by,
--metric, --baseline or --within is refused before anything is written.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from posenc.display.terminal import make_console
from posenc.errors import UserError
from posenc.record.metrics import (
    DEFAULT_TARGETS,
    TASK_ACCURACY,
    TRAIN_MFU,
    VAL_LOSS,
    VAL_LOSS_AUC,
    VAL_PPL,
    Target,
    convergence_metrics,
    parse_target,
    target_of,
    val_curve,
)
from posenc.record.rundir import SUMMARY_FILE
from posenc.report.caveats import warning_lines
from posenc.report.checked import VerdictOf, mark_arms
from posenc.report.comparison import Comparison, columns_for, is_task_run, length_order
from posenc.report.format import format_value
from posenc.report.rank_tables import rank_text_tables, verdict_lines
from posenc.report.ranking import leader
from posenc.report.runs import (
    Run,
    check_choice,
    deduplicate,
    find_runs,
    group_keys,
    group_runs,
    varying_keys,
)
from posenc.report.setup import (
    describe_varied,
    setup_line,
    setup_split,
    summarise_fixed,
)
from posenc.report.stats import aggregate, scale_of
from posenc.report.tables import rich_table, text_tables, too_few_note
from posenc.report.verdicts import (
    baseline_table,
    find_baseline,
    rank_within,
    ranking_of,
)
from posenc.report.write import report_stem, report_title, write_report


def convergence_targets(runs: Sequence[Run], asked: Sequence[float | str] | None) -> list[Target]:
    """--target values (2.5: val/loss; 1.2bpb: val/bpb), else the targets the runs were
    trained with, else the defaults; val/loss targets first, each kind highest first. Task runs
    (a loss over answer tokens alone) take no default: those are language-modelling losses."""
    try:
        wanted = [parse_target(t) for t in asked or []]
    except ValueError as e:
        raise UserError(f"--target: {e}") from None
    defaults = {Target(t) for t in DEFAULT_TARGETS}
    task = is_task_run({k for r in runs if r.ok for k in r.summary})
    found = {t for r in runs if r.ok for k in r.summary if (t := target_of(k)) is not None} - (defaults if task else set())
    chosen = set(wanted or found or ([] if task else defaults))
    return sorted(chosen, key=lambda t: (t.bpb, -t.value))


def at_first_eval(run: Run, target: Target) -> bool:
    """Whether the run's curve was already at or below the target at its first evaluation: its
    tokens-to-target is then only the first evaluation's token count, no information. The run's
    summary flag says so (convergence/before_first_eval_*); runs written before it: the curve."""
    flag = run.summary.get(target.first_eval_key)
    if flag is not None:
        return bool(flag)
    curve = val_curve(run.rows, target.curve_metric.name)
    return bool(curve) and curve[0][1] <= target.value


def crossed(runs: Sequence[Run], target: Target) -> bool:
    """Whether some finished run's loss came down through the target between two evaluations."""
    return any(r.ok and r.metric(target.tokens_key) is not None and not at_first_eval(r, target) for r in runs)


def metric_keys(runs: Sequence[Run]) -> list[str]:
    """The summary keys --metric accepts: numbers (or null: never reached) in a finished run."""
    return sorted({k for r in runs if r.ok for k, v in r.summary.items()
                   if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))})


def default_metric(runs: Sequence[Run]) -> str:
    """A task run: the task's accuracy at the training length (else its shortest length); else
    val/ppl, else val/loss, else the first numeric summary key: a comparison always has one."""
    keys = metric_keys(runs)
    accuracy = sorted((k for k in keys if TASK_ACCURACY.match(k)), key=length_order)
    if accuracy:
        trained = {int(r.config["trainer.seq_len"]) for r in runs if r.ok and "trainer.seq_len" in r.config}
        return next((k for k in accuracy if int(TASK_ACCURACY.match(k)["length"]) in trained), accuracy[0])
    return next((m for m in (VAL_PPL.name, VAL_LOSS.name) if m in keys), keys[0] if keys else VAL_PPL.name)


def add_run_metrics(runs: Sequence[Run], targets: Sequence[Target]) -> None:
    """Into each finished run's summary: convergence to targets it was not trained with (from its
    metrics.jsonl, by the function training uses) and its median MFU where it logged one."""
    for run in runs:
        if not run.ok:
            continue
        missing = [t for t in targets if t.tokens_key not in run.summary]
        if missing or VAL_LOSS_AUC.name not in run.summary:
            for key, value in convergence_metrics(run.rows, missing).items():
                run.summary.setdefault(key, value)
        mfu = [row[TRAIN_MFU.name] for row in run.rows if row.get(TRAIN_MFU.name) is not None]
        if mfu:
            run.summary.setdefault(TRAIN_MFU.name, statistics.median(mfu))


def check_keys(runs: Sequence[Run], by: Sequence[str] | None, within: str | None) -> None:
    """Refuse a --by or --within key these runs do not have: the closest few and the swept keys
    named, not the run's every config key."""
    valid, swept = group_keys(runs), varying_keys(runs)
    for key in (by or []):
        check_choice("--by key", key, valid, prefer=swept, shown=8)
    if within is not None:
        check_choice("--within key", within, valid, prefer=swept, shown=8)


def fill_cells(c: Comparison) -> dict[str, dict[str, list]]:
    """Every (group, column) Stat and each column's leader; returns {column key: {label: values}}.
    A seed already at a convergence target at its first evaluation counts as having no value there
    (c.early says how many)."""
    by_column = {}
    for col in c.columns:
        target = target_of(col.key)
        values = {}
        for g in c.groups:
            early = [target is not None and r.metric(col.key) is not None and at_first_eval(r, target)
                     for r in g.completed]
            values[g.label] = [None if e else v for e, v in zip(early, g.values(col.key))]
            c.cells[(g.label, col.key)] = aggregate(values[g.label], scale_of(col.key))
            if any(early):
                c.early[(g.label, col.key)] = sum(early)
        by_column[col.key] = {k: v for k, v in values.items() if v}
        if not col.cost:  # timings of single runs are never emphasised
            c.leaders[col.key] = leader(by_column[col.key], not col.lower_is_better, scale_of(col.key).log)
    return by_column


def build_comparison(runs: Sequence[Run], by: Sequence[str] | None, metric: str | None = None,
                     targets: Sequence[float | str] | None = None, baseline: str | None = None,
                     within: str | None = None, verdict_of: VerdictOf | None = None) -> Comparison:
    """The whole comparison, computed before anything is written, so a mistaken option is
    refused (UserError naming the closest valid choices) with nothing on disk. Groups whose encoding
    fails `posenc check` are marked (report/checked.py; verdict_of: for runs that recorded none), and so
    are those with a run whose checkpoint does not rebuild its model (report/proved.py)."""
    runs, duplicates = deduplicate(runs)
    check_keys(runs, by, within)
    plain_by = [k for k in varying_keys(runs) if k != within]
    by = list(by) if by else plain_by
    chosen = convergence_targets(runs, targets)
    add_run_metrics(runs, chosen)  # a --metric may name a target's tokens, computed here
    if metric is not None:
        check_choice("--metric", metric, metric_keys(runs))
    shown = [t for t in chosen if targets or crossed(runs, t)]  # asked for: always shown
    options = {"metric": metric if metric not in (None, default_metric(runs)) else None,
               "by": ",".join(by) if by != plain_by else None, "within": within, "baseline": baseline,
               "targets": ",".join(map(str, chosen)) if targets else None}
    metric = metric or default_metric(runs)
    groups = group_runs(runs, by + ([within] if within else []))  # a cell never pools two values of --within
    base = find_baseline(groups, baseline) if baseline is not None else None  # as the user names it: unmarked
    unchecked, unproved = mark_arms(groups, verdict_of)
    fixed, varied = setup_split(runs)
    c = Comparison(by, groups, columns_for(runs, metric, shown), shown, {}, {}, metric, list(runs), duplicates,
                   fixed, varied, dropped_targets=[t for t in chosen if t not in shown], within=within)
    c.unchecked = unchecked
    c.unproved = unproved
    c.chosen = {k: v for k, v in options.items() if v}
    values = fill_cells(c)
    if base is not None:
        c.baseline = base
        c.versus = baseline_table(groups, c.baseline, metric)
    if within is None:
        c.ranking = ranking_of(groups, metric, values.get(metric))  # the cells' values: early seeds left out
    else:  # groups are ranked, and a best one named, among the runs of one value of --within at a time
        c.leaders = {}
        c.rankings, c.agreements = rank_within(runs, by, within, metric)
    return c


def failed_lines(c: Comparison, root: Path) -> list[str]:
    out = []
    for run in c.failed:
        error = run.metric("error") or (f"no {SUMMARY_FILE}: still running or killed" if run.status == "unfinished" else "")
        out.append(f"{relative(run.path, root)}: {run.status}" + (f" — {error}" if error else ""))
    return out


def duplicate_lines(c: Comparison, root: Path) -> list[str]:
    return [f"duplicate runs (same config, seed {format_value(kept.seed)}): "
            f"{', '.join(relative(r.path, root) for r in [kept, *dropped])} — counted once, keeping "
            f"{relative(kept.path, root)}" for kept, dropped in c.duplicates]


def relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def print_comparison(c: Comparison, console: Console, title: str, root: Path, seeds: bool, writes: bool = True) -> None:
    """The terminal's view: what varied, the tables (per-seed values with seeds), ranking, warnings,
    verdict, and last what was held fixed."""
    say = lambda text, style="": console.print(f"[{style}]{escape(text)}[/]" if style else escape(text),  # noqa: E731
                                               highlight=False)
    for line in duplicate_lines(c, root):
        say(f"warning: {line}", "bold yellow")
    say(f"{title}, grouped by {', '.join(c.keys) or 'nothing (one group: nothing varies)'} · {setup_line(c.runs)}",
        "bold")
    say(f"varied: {describe_varied(c.varied) or 'nothing'}")
    tables = text_tables(c, seeds=seeds, compact=True) + rank_text_tables(c)
    for table in tables:
        console.print(rich_table(table))
    if note := too_few_note(tables):
        say(note, "dim")
    for line in failed_lines(c, root):
        say(f"not averaged in: {line}", "bold red")
    for line in warning_lines(c):
        say(f"warning: {line}", "yellow")
    for line in verdict_lines(c):
        say(line, "bold")
    # what varied and the result first: the (often 50-70) keys every run shared close it, the headline ones named
    where = f"{report_stem(c)}.md lists every one" if writes else "--out DIR writes a report.md that lists every one"
    say(f"held fixed: {summarise_fixed(c.fixed, where)}" if c.fixed else "held fixed: nothing", "dim")


def compare(paths: Sequence[Path], by: Sequence[str] | None = None, metric: str | None = None,
            out: Path | None = None, targets: Sequence[float | str] | None = None, console: Console | None = None,
            baseline: str | None = None, within: str | None = None, seeds: bool = False,
            verdict_of: VerdictOf | None = None) -> Path | None:
    """Compare the runs under paths; print the tables; write plots and reports into out. Where
    nothing varies (one group) and no --out is given, nothing is written: a report of one group
    compares nothing, and the folder given is the user's runs, not a place for one."""
    console = console or make_console()
    c = build_comparison(find_runs(paths), by, metric, targets, baseline, within, verdict_of)  # refuses mistakes first
    title = report_title(c, paths)
    writes = out is not None or len(c.groups) > 1
    print_comparison(c, console, title, Path(out) if out else default_out(paths), seeds, writes)
    if not writes:
        runs = "one run" if len(c.runs) == 1 else f"{len(c.runs)} runs of one group (nothing varies among them)"
        console.print(f"no report written: {runs}, so there is nothing to compare — compare runs that differ "
                      "(several run or sweep dirs, or --by a key that varies), or give --out DIR to write this "
                      "group's report.html and figures there", highlight=False, soft_wrap=True)
        return None
    out = Path(out) if out else default_out(paths)
    written = write_report(c, out, paths, title, failed_lines(c, out), duplicate_lines(c, out), warning_lines(c))
    console.print(f"report: [bold]{written.html}[/] (and {written.markdown.name}, "
                  f"{', '.join(p.name for p in written.plots)})", highlight=False, soft_wrap=True)
    for line in written.lines():  # what it replaced, and the other reports it left beside it
        console.print(line, style="dim", highlight=False, soft_wrap=True)
    return out


def default_out(paths: Sequence[Path]) -> Path:
    """One run or sweep (or folder) given: write there, next to its data. Several: a new folder."""
    if len(paths) == 1:
        return Path(paths[0])
    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d/%H-%M-%S")
