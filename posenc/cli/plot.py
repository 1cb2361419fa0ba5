"""`posenc plot decay|extrapolation`: the PNG figures of plots.py from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

plot_app = typer.Typer(no_args_is_help=True, help="Figures as PNG: RoPE's long-term decay, perplexity against length.")


@plot_app.command()
def decay(
    bases: list[float] = typer.Option([500.0, 10000.0, 500000.0], "--base", help="RoPE base (repeat for several)"),
    head_dim: int = typer.Option(128, help="head dimension d (RoFormer's figure: 128)"),
    max_distance: int = typer.Option(256, help="largest relative distance on the x-axis"),
    out: Path = typer.Option(Path("rope_decay.png"), help="PNG to write"),
) -> None:
    """RoFormer §3.4.3: the upper bound of the relative score against distance, per base."""
    from posenc.cli.app import console, fail, run_guarded
    from posenc.report.plots_length import plot_decay

    if head_dim < 2 or head_dim % 2 or max_distance < 1 or any(b <= 1 for b in bases):
        fail("--head-dim must be even and >= 2, --max-distance >= 1, every --base > 1")
    path = run_guarded(lambda: plot_decay(bases, head_dim, max_distance, out), debug=False)
    console.print(f"wrote [bold]{path}[/]")


@plot_app.command()
def extrapolation(
    paths: list[Path] = typer.Argument(..., help="run directories or sweep directories (as for `posenc compare`)"),
    out: Path = typer.Option(Path("extrapolation.png"), help="PNG to write"),
) -> None:
    """Perplexity against evaluation length (log-x), one line per group of `posenc compare`
    (mean ± std over seeds), training length marked."""
    from posenc.cli.app import console, run_guarded
    from posenc.report.plots_length import extrapolation_groups, plot_extrapolation

    path = run_guarded(lambda: plot_extrapolation(extrapolation_groups(paths), out), debug=False)
    console.print(f"wrote [bold]{path}[/]")
