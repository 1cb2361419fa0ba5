"""`posenc encodings`: the encodings and their options, read from conf/encoding/*.yaml."""

from __future__ import annotations

import typer

from posenc.cli.common import console, err_console
from posenc.config import encoding_catalogue
from posenc.config.searchpath import shadow_line, shadowed_options


def encodings() -> None:
    """List the encodings and their options: conf/encoding/*.yaml, and every plugin config dir
    (--config-dir, POSENC_CONFIG_PATH, posenc.plugins entry points)."""
    from rich.markup import escape
    from rich.table import Table


    catalogue = [(name, doc, [f"{k}={yaml_value(v)}" for k, v in options.items()])
                 for name, doc, options in encoding_catalogue()]
    # the options column is never cut (a piped console is 80 columns wide): it is as wide as its
    # longest `key=value`, and the descriptions wrap in what is left
    widest = max(len(line) for _, _, lines in catalogue for line in lines)
    table = Table(title="positional encodings", title_justify="left")
    table.add_column("encoding=", style="bold cyan", no_wrap=True)
    table.add_column("what it is", ratio=1)
    table.add_column("options (encoding.<key>=…, default)", min_width=widest, no_wrap=True)
    for name, doc, lines in catalogue:
        table.add_row(name, escape(doc), escape("\n".join(lines)) or "—")
    console.print(table)
    for name, holders in shadowed_options("encoding"):  # a file of a name another source also holds
        err_console.print(shadow_line("encoding", name, holders), markup=False, highlight=False, soft_wrap=True)


def yaml_value(value) -> str:
    """An option's default as its YAML spells it: 10000, 1.0, null, true."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def register(app: typer.Typer) -> None:
    app.command()(encodings)
