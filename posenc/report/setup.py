"""What a comparison held fixed and what it varied, in words for a report and a figure title.

A reader of a table of encodings needs to know that everything else was the same; the
config of every run says so, key by key. Keys that say where or how a run was made (paths,
logger, device) are left out: they are not the setup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc.record.metrics import TOKENS_SEEN
from posenc.report.format import format_number
from posenc.report.runs import Run, format_value, is_run_specific

ABSENT = "<absent>"


def fixed_and_varied(configs: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """What a set of runs held fixed and what varied, from their flattened configs: ({key: the
    shared value}, {key: sorted distinct values as strings, ABSENT for runs without the key}).
    A number is one value however it was typed: 10000 and 10000.0 are one."""
    keys = sorted(set().union(*configs)) if configs else []
    fixed, varied = {}, {}
    for key in keys:
        values = [c.get(key, ABSENT) for c in configs]
        if all(v == values[0] for v in values):
            fixed[key] = values[0]
        else:
            distinct: dict[str, str] = {}  # one value -> the first spelling seen
            for v in values:
                distinct.setdefault(_identity(v), str(v))
            varied[key] = sorted(distinct.values(), key=_numbers_first)
    return fixed, varied


def _identity(value: Any) -> str:
    """What makes two config values one: a number's value (10000 and 10000.0 are one), else its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(float(value))
    return str(value)


def _numbers_first(text: str) -> tuple:
    """'100' < '1000' < '5e5' < 'alibi': numbers by value, then the rest alphabetically."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def setup_split(runs: Sequence[Run]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """({key: value shared by every run}, {key: its distinct values}) over the runs' configs,
    without run-specific keys and the `_target_` classes (the `name` next to them says it)."""
    fixed, varied = fixed_and_varied([r.config for r in runs])
    keep = lambda k: not is_run_specific(k) and not k.endswith("._target_")  # noqa: E731
    return {k: v for k, v in fixed.items() if keep(k)}, {k: v for k, v in varied.items() if keep(k)}


def describe(items: dict[str, Any]) -> str:
    """'model.n_layer=2, trainer.seq_len=32' (values as typed: 1e4, not 10000.0)."""
    return ", ".join(f"{k}={format_value(v)}" for k, v in items.items())


#: the keys a reader checks first that a comparison held fixed (the rest are counted, report.md lists all)
HEADLINE = ("dataset.name", "dataset.task", "tokenizer.name", "encoding.name", "layout.name", "model.flavor",
            "model.n_layer", "model.n_head", "model.d_model", "trainer.seq_len", "trainer.batch_size",
            "trainer.max_steps", "trainer.lr", "seed")


def summarise_fixed(items: dict[str, Any], where: str) -> str:
    """'dataset.name=pystdlib, model.n_layer=2, …, and 52 more keys (where)': the headline keys
    held fixed, the others counted, for a terminal (report.md lists every one)."""
    shown = {k: items[k] for k in HEADLINE if k in items}
    rest = len(items) - len(shown)
    more = f"{'and ' if shown else ''}{rest} more key{'' if rest == 1 else 's'} ({where})" if rest else ""
    return ", ".join([describe(shown)] * bool(shown) + [more] * bool(more))


def describe_varied(varied: dict[str, list[str]]) -> str:
    """'encoding.name ∈ {alibi, rope}; seed ∈ {0, 1}'. An option only some runs have (RoPE's base
    when RoPE is compared with ALiBi) is listed only where it took more than one value among them:
    otherwise it follows from the choice above and says nothing."""
    parts = []
    for key, values in varied.items():
        present = [v for v in values if v != ABSENT]
        if len(present) > 1:
            only = " (where set)" if ABSENT in values else ""
            parts.append(f"{key} ∈ {{{', '.join(map(_pretty, present))}}}{only}")
    return "; ".join(parts)


def _pretty(text: str) -> str:
    """'500000.0' -> '5e5', '2.0' -> '2', 'rope' -> 'rope'."""
    try:
        return format_value(float(text))
    except ValueError:
        return text


def _shared(values: list) -> Any:
    values = [v for v in values if v is not None]
    return values[0] if values and all(v == values[0] for v in values) else None


def setup_line(runs: Sequence[Run]) -> str:
    """A figure's second title line: model flavour and shape, training length T, tokens
    trained and seeds, e.g. 'llama 2L×2H d=32 · T=32 · 4.1k tokens · seeds 0,1,2'."""
    done = [r for r in runs if r.ok] or list(runs)
    if not done:
        return ""
    cfg = lambda key: _shared([r.config.get(key) for r in done])  # noqa: E731
    has = lambda key: any(key in r.config for r in done)  # noqa: E731
    parts = []
    shape = [f"{format_value(v)}{unit}" for key, unit in (("model.n_layer", "L"), ("model.n_head", "H"))
             if (v := cfg(key)) is not None]
    flavor = cfg("model.flavor") or ("flavours vary" if has("model.flavor") else "")
    model = " ".join(p for p in (flavor, "×".join(shape),
                                  f"d={format_value(cfg('model.d_model'))}" if cfg("model.d_model") else "") if p)
    if model or any(has(k) for k in ("model.flavor", "model.n_layer", "model.d_model")):
        parts.append(model or "model varies")
    if has("trainer.seq_len"):
        parts.append(f"T={format_value(cfg('trainer.seq_len'))}" if cfg("trainer.seq_len") else "T varies")
    tokens = _shared([r.metric(TOKENS_SEEN.name) for r in done])
    if tokens is not None:
        parts.append(f"{format_number(float(tokens), 'tokens')} tokens")
    seeds = sorted({r.seed for r in done if r.seed is not None}, key=lambda s: (str(type(s)), s))
    if seeds:
        parts.append(("seed " if len(seeds) == 1 else "seeds ") + ",".join(format_value(s) for s in seeds))
    return " · ".join(parts)
