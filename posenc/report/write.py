"""A comparison's files: the PNG figures, report.md and report.html, written into one folder.

A second compare into the same folder (another --metric, another --within) replaces the first:
the figures the earlier report.md showed and this one does not write are removed, so no stale
figure is left next to a report that does not mention it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from posenc.record.metrics import EXTRAPOLATION_PPL
from posenc.record.sweepdir import SweepDir
from posenc.report.comparison import Comparison
from posenc.report.document import Document, write_html, write_markdown
from posenc.report.plots import plot_convergence, plot_final, plot_tokens_to_target
from posenc.report.plots_length import (
    plot_extrapolation,
    plot_task_accuracy,
    task_names,
)
from posenc.report.plots_rank import plot_ranks
from posenc.report.rank_tables import rank_note, rank_text_tables, verdict_lines
from posenc.report.setup import describe, describe_varied, setup_line
from posenc.report.tables import text_tables

NOTES = ("Each cell: the mean over seeds and its 95% t-interval [low, high] (one seed: the value alone, no "
         "interval). Perplexity, token counts and rates are positive and multiplicative: their cell is the geometric "
         "mean with the interval of the mean log (for perplexity: of the loss) mapped back with exp, so it is never "
         "negative and the same in every table and figure. A cell is bold only where its group is ahead of every "
         "other group by a detectable margin (Welch's 95% interval of the difference, on the same scale, excludes "
         "none); the 'best' row names that group, or the groups tied with the leader (with --within the groups are "
         "compared within each value of the key, in the rankings below). Per-seed values follow each "
         "table. →x: tokens until val/loss reaches x (→xbpb: val/bpb reaches x bits/byte), interpolated between the "
         "two evaluations that bracket x (—: never; k/n seeds: only k got there, so no mean; ≤ first eval: already "
         "below x at the first evaluation, so the count says nothing). AUC: area under val/loss(tokens) / token span "
         "= token-weighted mean val/loss (lower = faster). Cost: each run's training loop timed once, on whatever "
         "else the machine ran; never emphasised. Against a baseline: group − baseline (perplexity-like: group / "
         "baseline) with Welch's 95% interval; 'better'/'worse' only when the interval excludes no difference.")


def report_title(c: Comparison, paths: Sequence[Path]) -> str:
    sweep = SweepDir(paths[0]).info() if len(paths) == 1 else None
    return f"{sweep['name'] if sweep else 'comparison'}: {len(c.runs)} run{'' if len(c.runs) == 1 else 's'}"


def figures_in(report: Path) -> set[str]:
    """The PNG file names an earlier report.md in the folder shows (none without one)."""
    if not report.exists():
        return set()
    return set(re.findall(r"!\[[^\]]*\]\(([^)/\\]+\.png)\)", report.read_text()))


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9@.]+", "_", text)


def make_plots(c: Comparison, out: Path, title: str, setup: str) -> list[Path]:
    by_text = f" by {', '.join(c.keys)}" if c.keys else ""
    plots = [plot_convergence(c.groups, out / "convergence.png", f"Validation loss, {title}", c.targets, setup),
             plot_final(c.groups, c.keys, c.metric, out / f"final_{safe_name(c.metric)}.png",
                        f"Final {c.metric}{by_text}", setup)]
    if c.targets:
        plots.append(plot_tokens_to_target(c.groups, c.targets, out / "tokens_to_loss.png", "Tokens to reach a target",
                                           setup))
    if any(EXTRAPOLATION_PPL.match(col.key) for col in c.columns):  # some finished run was evaluated at other lengths
        plots.append(plot_extrapolation(c.groups, out / "extrapolation.png", f"Perplexity against length, {title}", setup))
    for task in task_names(c.groups):  # some finished run was a synthetic task scored at several lengths
        plots.append(plot_task_accuracy(c.groups, task, out / f"accuracy_{task}.png",
                                        f"{task} accuracy against length, {title}", setup))
    if c.within and c.rankings:
        plots.append(plot_ranks(c.rankings, c.within, c.metric, out / f"ranks_{safe_name(c.within)}.png",
                                f"Rank by {c.metric} against {c.within}", setup))
    return plots


def write_report(c: Comparison, out: Path, paths: Sequence[Path], title: str, failed: list[str],
                 duplicates: list[str], warnings: list[str]) -> list[Path]:
    """Figures, report.md and report.html into out (per-seed values included); returns the figures."""
    out.mkdir(parents=True, exist_ok=True)
    previous = figures_in(out / "report.md")
    setup = setup_line(c.runs)
    plots = make_plots(c, out, title, setup)
    sweep = SweepDir(paths[0]).info() if len(paths) == 1 else None
    notes = [NOTES] + ([rank_note(c)] if c.ranking or c.rankings else []) + warnings
    doc = Document(title, setup, sweep, describe_varied(c.varied), describe(c.fixed),
                   text_tables(c, seeds=True) + rank_text_tables(c), notes, failed, duplicates, plots,
                   verdicts=verdict_lines(c))
    write_markdown(out / "report.md", doc)
    write_html(out / "report.html", doc)
    for stale in previous - {p.name for p in plots}:
        (out / stale).unlink(missing_ok=True)
    return plots
