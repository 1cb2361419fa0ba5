"""The `posenc` command line: Typer owns the command words, Hydra everything after them."""

from posenc.cli.app import app, main

__all__ = ["app", "main"]
