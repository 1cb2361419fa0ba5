"""A run's kernel record read back (posenc/nn/kernels.py writes it: summary.json's ``kernels``, a
bench row's, eval.json's): the marks a table shows, the lines under it, and whether two runs ran
alike.

    {"compiled": true, "compile_asked": true,
     "layer_kinds": {"global": {"layers": [0, 1], "encoding": "t5_bias", "mixer": "softmax", "path": "dense"}},
     "fallbacks": [{"layer_kind": "global", "encoding": "t5_bias", "left": "flex", "took": "dense",
                    "reason": "InductorError: …", "step": 3}],
     "recompile_limit": 64}
"""

from __future__ import annotations

KEY = "kernels"


def short(path: str) -> str:
    """A path as a table shows it: 'fused:parallel_forgetting_attn' -> 'fused', 'flex #1 (BLOCK_M=…)'
    -> 'flex#1'."""
    return path.split(" (", 1)[0].split(":", 1)[0].replace(" ", "")


def mark(fallback: dict) -> str:
    """'↓dense@3': the path a fallback took and its step."""
    return f"↓{short(fallback['took'])}" + ("" if fallback.get("step") is None else f"@{fallback['step']}")


def line(fallback: dict) -> str:
    """'global (t5_bias): flex → dense at step 3: InductorError: …'."""
    who = fallback["layer_kind"] + (f" ({fallback['encoding']})" if fallback.get("encoding") else "")
    when = "" if fallback.get("step") is None else f" at step {fallback['step']}"
    return f"{who}: {fallback['left']} → {fallback['took']}{when}: {fallback['reason']}"


def marks(record: dict | None) -> str:
    """'↓dense@3 ↓uncompiled@5': every fallback of a record, '' where none (or no record)."""
    return " ".join(mark(f) for f in (record or {}).get("fallbacks", []))


def lines(record: dict | None) -> list[str]:
    """One line per fallback of a record."""
    return [line(f) for f in (record or {}).get("fallbacks", [])]


def signature(record: dict | None) -> str:
    """How a run ran, in one string: each layer kind's path and whether compiled,
    'global=flex, compiled'; '' for a run without a record (written before posenc kept one)."""
    if not record:
        return ""
    parts = [f"{name}={short(kind.get('path') or '?')}" for name, kind in record.get("layer_kinds", {}).items()]
    return ", ".join([*parts, "compiled" if record.get("compiled") else "uncompiled"])


def fell_back(record: dict | None) -> bool:
    return bool((record or {}).get("fallbacks"))


def brief(record: dict | None) -> str:
    """signature and marks: 'global=dense, compiled ↓dense@1' ('' for no record): a leaderboard row's
    per-seed entry."""
    return " ".join(p for p in (signature(record), marks(record)) if p)
