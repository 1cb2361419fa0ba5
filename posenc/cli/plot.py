"""`posenc plot decay|extrapolation`: the PNG figures of report/plots_length.py from the command line.

A figure goes next to the data it shows (the sweep or run directory) or, when it shows no
data or several places' data, under outputs/plots/; never into the current directory.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from posenc.cli.common import console, fail, run_guarded

PLOTS_DIR = Path("outputs") / "plots"
FIGURE = "ppl_by_length.png"  # not compare's extrapolation.png: a report's figures belong to its report

plot_app = typer.Typer(no_args_is_help=True, help="Figures as PNG: RoPE's long-term decay, perplexity against length.")


def default_out(paths: list[Path], name: str) -> Path:
    """PNG name inside the one directory given, else under outputs/plots/."""
    return (paths[0] if len(paths) == 1 and paths[0].is_dir() else PLOTS_DIR) / name


def png_path(out: Path | None, default: Path) -> Path:
    """--out as given: a file name with a suffix (fig.png) is the file; anything else is a
    directory (as compare's --out is) that gets the default file name inside it."""
    if out is None:
        return default
    return out if out.suffix and not out.is_dir() else out / default.name


@plot_app.command()
def decay(
    bases: list[float] = typer.Option([500.0, 10000.0, 500000.0], "--base", help="RoPE base (repeat for several)"),
    head_dim: int = typer.Option(128, help="head dimension d (RoFormer's figure: 128)"),
    max_distance: int = typer.Option(256, help="largest relative distance on the x-axis"),
    out: Path = typer.Option(None, help=f"PNG file (x.png) or a directory to write into [default: {PLOTS_DIR / 'rope_decay.png'}]"),
) -> None:
    """RoFormer §3.4.3: the upper bound of the relative score against distance, per base."""
    from posenc.report.plots_length import plot_decay  # start-up: matplotlib and torch when it runs

    if head_dim < 2 or head_dim % 2 or max_distance < 1 or any(b <= 1 for b in bases):
        fail("--head-dim must be even and >= 2, --max-distance >= 1, every --base > 1")
    out = png_path(out, PLOTS_DIR / "rope_decay.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    path = run_guarded(lambda: plot_decay(bases, head_dim, max_distance, out), debug=False)
    console.print(f"wrote [bold]{path}[/]")


@plot_app.command()
def extrapolation(
    paths: list[Path] = typer.Argument(..., help="run directories or sweep directories (as for `posenc compare`)"),
    out: Path = typer.Option(None, help=f"PNG file (x.png) or a directory to write into [default: {FIGURE} in the one "
                                        f"directory given, else {PLOTS_DIR}/]"),
    no_check: bool = typer.Option(False, "--no-check", help="do not look up `posenc check`'s verdict for runs that "
                                  "recorded none (recorded verdicts still mark their arms)"),
) -> None:
    """Perplexity against evaluation length (log-x), one line per group of `posenc compare`
    (geometric mean and 95% interval over seeds, as compare's tables), training length marked; an arm
    is marked as compare marks it (✗check: its encoding fails `posenc check`; ✗ckpt: a checkpoint of
    its runs does not rebuild the model that trained), with a line saying why.
    Never overwrites the extrapolation.png of compare's report, nor writes a copy of it beside it."""
    from posenc.cli.runs import run_verdict  # start-up
    from posenc.report.checked import mark_arms
    from posenc.report.plots_length import extrapolation_groups, plot_extrapolation

    def plot() -> Path | None:
        groups = extrapolation_groups(paths)  # refuses missing paths before anything is written
        for lines in mark_arms(groups, None if no_check else run_verdict):
            for line in lines:
                console.print(f"[yellow]warning: {escape(line)}[/]", highlight=False, soft_wrap=True)
        report = compare_figure(paths)
        if out is None and report is not None:
            return None
        target = png_path(out, default_out(paths, FIGURE))
        target.parent.mkdir(parents=True, exist_ok=True)
        return plot_extrapolation(groups, target)

    written = run_guarded(plot, debug=False)
    if written is None:  # the same figure as the report's: one file, not two
        console.print(f"not written: {compare_figure(paths)} is this figure, drawn by `posenc compare` for its report "
                      f"(run compare again to redraw it with newer runs; --out FILE writes a copy elsewhere)",
                      highlight=False, soft_wrap=True)
        return
    console.print(f"wrote [bold]{written}[/]")


def compare_figure(paths: list[Path]) -> Path | None:
    """compare's extrapolation.png in the one directory given, where one of its reports shows it."""
    if len(paths) != 1:
        return None
    figure = paths[0] / "extrapolation.png"
    shown = any("](extrapolation.png)" in report.read_text() for report in paths[0].glob("report*.md"))
    return figure if figure.is_file() and shown else None
