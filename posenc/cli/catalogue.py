"""`posenc encodings`: the encodings and their options, read from conf/encoding/*.yaml."""

from __future__ import annotations

import typer

from posenc.cli.common import console


def encodings() -> None:
    """List the encodings and their options (from conf/encoding/*.yaml)."""
    from rich.markup import escape
    from rich.table import Table

    from posenc.config import encoding_catalogue

    table = Table(title="positional encodings", title_justify="left")
    table.add_column("encoding=", style="bold cyan")
    table.add_column("what it is")
    table.add_column("options (encoding.<key>=…, default)")
    for name, doc, options in encoding_catalogue():
        table.add_row(name, escape(doc), escape("\n".join(f"{k}={v}" for k, v in options.items())) or "—")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(encodings)
