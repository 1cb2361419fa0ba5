"""Numbers and config values as the report writes them, in one place for every table and title."""

from __future__ import annotations

from typing import Any


def format_value(value: Any) -> str:
    """A config value as typed: 100.0 -> '100', 10000.0 -> '10000' (as a base is typed and printed
    everywhere else), 0.25 -> '0.25', 'rope' -> 'rope'."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def format_number(value: float, fmt: str) -> str:
    """A metric for a table cell: fmt is "tokens" (3.2k, 1.5M), "rate" (1,891), "ppl" (3 decimals),
    "accuracy" (a percentage) or "loss" (4 decimals)."""
    if fmt == "tokens":
        for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(value) >= scale:
                return f"{value / scale:.3g}{unit}"
        return f"{value:.0f}"
    if fmt == "rate":
        return f"{value:,.0f}"
    if fmt == "ppl":
        return f"{value:.3f}"
    if fmt == "accuracy":
        return f"{100 * value:.1f}%"
    return f"{value:.4f}"
