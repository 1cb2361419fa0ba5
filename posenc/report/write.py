"""A comparison's files: the PNG figures, report.md and report.html, written into one folder.

A report is named by what it was asked that a plain `posenc compare` is not (Comparison.chosen):
``report.md`` for the plain one, ``report_extrapolation_ppl@1024.md`` for ``--metric
extrapolation/ppl@1024``, ``report_within-model.flavor.md`` … and each figure by what it depends
on (``final_<metric>.png``; the groups' keys where --by or --within made other groups; the targets
for the convergence figures), so two compares of one sweep with other options leave both reports
and every figure each shows, a figure two reports draw alike shared. The same compare again
replaces its own report, and says so; the figures its earlier version showed that no report in the
folder shows any more are removed, so no stale figure is left next to a report that does not
mention it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.record.metrics import EXTRAPOLATION_PPL
from posenc.record.sweepdir import SweepDir
from posenc.report.comparison import Comparison
from posenc.report.document import Document, write_html, write_markdown
from posenc.report.plots import plot_convergence, plot_tokens_to_target
from posenc.report.plots_final import plot_final
from posenc.report.plots_length import (
    plot_extrapolation,
    plot_task_accuracy,
    task_names,
)
from posenc.report.plots_rank import plot_ranks
from posenc.report.rank_tables import rank_note, rank_text_tables, verdict_lines
from posenc.report.setup import describe, describe_varied, setup_line
from posenc.report.tables import text_tables, too_few_note

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
    return re.sub(r"[^A-Za-z0-9@.,=-]+", "_", text)


def suffix(c: Comparison, *options: str) -> str:
    """'_by-encoding.base_within-model.flavor': these of the options the report was asked for."""
    parts = [value if option == "metric" else f"{'vs' if option == 'baseline' else option}-{value}"
             for option in ("metric", "by", "within", "baseline", "targets")
             if option in options and (value := c.chosen.get(option))]
    return "".join(f"_{safe_name(part)}" for part in parts)


def report_stem(c: Comparison) -> str:
    """report, or report_<what this compare was asked beyond a plain one>."""
    return "report" + suffix(c, "metric", "by", "within", "baseline", "targets")


def make_plots(c: Comparison, out: Path, title: str, setup: str) -> list[Path]:
    by_text = f" by {', '.join(c.keys)}" if c.keys else ""
    groups = suffix(c, "by", "within")  # another --by or --within: other groups, other figures
    plots = [plot_convergence(c.groups, out / f"convergence{groups}{suffix(c, 'targets')}.png",
                              f"Validation loss, {title}", c.targets, setup),
             plot_final(c.groups, c.keys, c.metric, out / f"final_{safe_name(c.metric)}{groups}.png",
                        f"Final {c.metric}{by_text}", setup, c.leaders.get(c.metric))]
    if c.targets:
        plots.append(plot_tokens_to_target(c.groups, c.targets, out / f"tokens_to_loss{groups}{suffix(c, 'targets')}.png",
                                           "Tokens to reach a target", setup))
    if any(EXTRAPOLATION_PPL.match(col.key) for col in c.columns):  # some finished run was evaluated at other lengths
        plots.append(plot_extrapolation(c.groups, out / f"extrapolation{groups}.png",
                                        f"Perplexity against length, {title}", setup))
    for task in task_names(c.groups):  # some finished run was a synthetic task scored at several lengths
        plots.append(plot_task_accuracy(c.groups, task, out / f"accuracy_{task}{groups}.png",
                                        f"{task} accuracy against length, {title}", setup))
    if c.within and c.rankings:
        plots.append(plot_ranks(c.rankings, c.within, c.metric, out / f"ranks_{safe_name(c.within)}"
                                f"{suffix(c, 'metric', 'by')}.png", f"Rank by {c.metric} against {c.within}", setup,
                                ", ".join(c.by) or None))
    return plots


@dataclass(frozen=True)
class Written:
    """What a compare wrote into its folder, and what it found there."""
    markdown: Path
    html: Path
    plots: list[Path]
    replaced: bool            # an earlier report of the same name (the same options) was replaced
    removed: list[str]        # figures only that earlier report showed
    beside: list[str]         # the other reports in the folder, left as they were

    def lines(self) -> list[str]:
        out = []
        if self.replaced:
            out.append(f"replaced the earlier {self.markdown.name} and .html (the same options)"
                       + (f", and removed the figures only it showed: {', '.join(self.removed)}" if self.removed else ""))
        if self.beside:
            out.append(f"left beside it: {', '.join(self.beside)} (other options of `posenc compare`)")
        return out


def other_reports(out: Path, stem: str) -> list[Path]:
    """The reports in out but stem's (report.md, report_<options>.md)."""
    return sorted(p for p in out.glob("report*.md") if p.stem != stem and re.fullmatch(r"report(_.+)?", p.stem))


def write_report(c: Comparison, out: Path, paths: Sequence[Path], title: str, failed: list[str],
                 duplicates: list[str], warnings: list[str]) -> Written:
    """Figures, report<options>.md and .html into out (per-seed values included)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = report_stem(c)
    markdown, page = out / f"{stem}.md", out / f"{stem}.html"
    replaced = markdown.exists()
    previous = figures_in(markdown)
    setup = setup_line(c.runs)
    plots = make_plots(c, out, title, setup)
    sweep = SweepDir(paths[0]).info() if len(paths) == 1 else None
    tables = text_tables(c, seeds=True) + rank_text_tables(c)
    notes = [NOTES, *filter(None, [too_few_note(tables)])] + ([rank_note(c)] if c.ranking or c.rankings else []) \
        + warnings
    doc = Document(title, setup, sweep, describe_varied(c.varied), describe(c.fixed), tables, notes, failed,
                   duplicates, plots, verdicts=verdict_lines(c))
    write_markdown(markdown, doc)
    write_html(page, doc)
    others = other_reports(out, stem)
    shown_elsewhere = set().union(*(figures_in(p) for p in others)) if others else set()
    removed = sorted(previous - {p.name for p in plots} - shown_elsewhere)
    for stale in removed:
        (out / stale).unlink(missing_ok=True)
    return Written(markdown, page, plots, replaced, removed, [p.with_suffix(".html").name for p in others])
