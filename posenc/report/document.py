"""report.md and report.html: the same tables the terminal shows, the setup, the figures.

The html is one self-contained file (PNGs embedded as base64) so it can be mailed or attached.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TextTable:
    """A table as text, for any renderer: title, header, rows, and the (row, column) cells to
    emphasise (the best value of a column)."""
    title: str
    header: list[str]
    rows: list[list[str]]
    best: set[tuple[int, int]] = field(default_factory=set)
    label_column: int = 0      # the column that names the group (left-aligned, emphasised)


@dataclass
class Document:
    title: str
    setup: str                 # model, T, tokens, seeds in one line
    sweep: dict | None         # the sweep's record (command, start), when one sweep is compared
    varied: str
    fixed: str
    tables: list[TextTable]
    notes: list[str]
    failed: list[str]
    duplicates: list[str]
    plots: list[Path]
    verdicts: list[str] = field(default_factory=list)   # the comparison's answer, shown above the tables


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(t: TextTable) -> str:
    lines = [f"**{t.title}**", "", "| " + " | ".join(map(_md_cell, t.header)) + " |", "|" + "---|" * len(t.header)]
    for i, row in enumerate(t.rows):
        cells = [f"**{_md_cell(text)}**" if (i, j) in t.best else _md_cell(text) for j, text in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_markdown(path: Path, doc: Document) -> None:
    parts = [f"# {doc.title}", "", doc.setup, ""]
    if doc.sweep:
        parts += [f"Command: `{doc.sweep['command']}` (started {doc.sweep['started']})", ""]
    parts += [f"**Varied:** {doc.varied or 'nothing'}", ""]
    parts += [line for verdict in doc.verdicts for line in (f"**{_md_cell(verdict)}**", "")]
    for table in doc.tables:
        parts += [markdown_table(table), ""]
    parts += [line for note in doc.notes for line in (note, "")]  # one paragraph each
    parts += [f"**Held fixed:** {doc.fixed or 'nothing'}", ""]  # after the result: often ~50 keys
    if doc.duplicates:
        parts += ["## Duplicate runs (counted once)", "", *[f"- {line}" for line in doc.duplicates], ""]
    if doc.failed:
        parts += ["## Failed or unfinished (not averaged in)", "", *[f"- {line}" for line in doc.failed], ""]
    parts += [f"![{p.stem}]({p.name})" for p in doc.plots]
    path.write_text("\n".join(parts) + "\n")


def html_table(t: TextTable) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.header)
    rows = []
    for i, row in enumerate(t.rows):
        cells = [f"<b>{html.escape(x)}</b>" if (i, j) in t.best else html.escape(x) for j, x in enumerate(row)]
        rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    return f"<h3>{html.escape(t.title)}</h3><table><tr>{head}</tr>{''.join(rows)}</table>"


def write_html(path: Path, doc: Document) -> None:
    body = [f"<h1>{html.escape(doc.title)}</h1>", f"<p>{html.escape(doc.setup)}</p>"]
    if doc.sweep:
        body.append(f"<p>Command: <code>{html.escape(doc.sweep['command'])}</code> "
                    f"(started {html.escape(doc.sweep['started'])})</p>")
    body += [f"<p><b>Varied:</b> {html.escape(doc.varied or 'nothing')}</p>"]
    body += [f"<p><b>{html.escape(verdict)}</b></p>" for verdict in doc.verdicts]
    body += [html_table(t) for t in doc.tables]
    body += [f"<p class=note>{html.escape(note)}</p>" for note in doc.notes]
    body.append(f"<p class=note><b>Held fixed:</b> {html.escape(doc.fixed or 'nothing')}</p>")
    for heading, lines in (("Duplicate runs (counted once)", doc.duplicates),
                           ("Failed or unfinished (not averaged in)", doc.failed)):
        if lines:
            body += [f"<h2>{heading}</h2><ul>", *[f"<li>{html.escape(line)}</li>" for line in lines], "</ul>"]
    body += [f'<img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
             for p in doc.plots]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
             "img{max-width:100%;display:block;margin:1em 0}.note{color:#555;font-size:90%}")
    path.write_text(f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(doc.title)}</title>"
                    f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
