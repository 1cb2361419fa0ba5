"""One look per encoding in every figure: a fixed colour, line style and marker.

The line style says the family, derived from the hooks the group's encoding class overrides
(docs/architecture.md), never from its name: solid for rotary (`transform_qk`,
`rotary_frequencies`), dash-dot for a bias on the scores (`position_bias` or `distance_bias`), dashed for additive
(`embed`), dotted for none or a content-dependent one; a mechanism (`encoding.inner`) is drawn as
the encoding it wraps. The shipped encodings keep a fixed colour and marker; any other label (a
plugin's encoding, grouping by `encoding.base`, `model.flavor`, ...) gets a colour from its name's
hash, probing for a free one, so the same label keeps its colour in every figure of a report
and, mostly, across reports.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Style:
    color: str
    linestyle: str
    marker: str

    def line(self) -> dict:
        """Keyword arguments for Axes.plot / errorbar."""
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker}


# matplotlib's tab10, then dark shades of tab20b and black: sixteen that stay apart side by side
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#000000")

ROTARY, ADDITIVE, BIAS, OTHER = "-", "--", "-.", ":"

ENCODING_STYLES: dict[str, Style] = {
    "rope": Style(PALETTE[0], ROTARY, "o"),
    "xpos": Style(PALETTE[9], ROTARY, "v"),
    "p_rope": Style(PALETTE[10], ROTARY, "^"),
    "rope_nope": Style(PALETTE[4], ROTARY, "P"),
    "sinusoidal": Style(PALETTE[1], ADDITIVE, "s"),
    "learned": Style(PALETTE[5], ADDITIVE, "D"),
    "alibi": Style(PALETTE[2], BIAS, "o"),
    "t5_bias": Style(PALETTE[3], BIAS, "s"),
    "kerple": Style(PALETTE[11], BIAS, "^"),
    "fire": Style(PALETTE[12], BIAS, "D"),
    "nope": Style(PALETTE[7], OTHER, "x"),
    "cope": Style(PALETTE[6], OTHER, "*"),
}

_FREE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@lru_cache(maxsize=None)
def family_of(target: str) -> str | None:
    """The line style of the encoding class ``target`` names, from the hooks it overrides; None
    when the class cannot be imported here (a plugin not on this machine's path)."""
    from hydra.utils import get_class

    from posenc.nn.encodings.base import PositionalEncoding  # start-up: torch, only for a plug-in's class

    try:
        cls = get_class(target)
    except Exception:  # noqa: BLE001 - a figure is still drawn, in the default style
        return None
    if not (isinstance(cls, type) and issubclass(cls, PositionalEncoding)):
        return None
    overrides = lambda hook: getattr(cls, hook) is not getattr(PositionalEncoding, hook)  # noqa: E731
    if overrides("transform_qk") or overrides("rotary_frequencies"):
        return ROTARY
    if overrides("position_bias") or overrides("distance_bias"):  # a relative bias writes only its table
        return BIAS
    if overrides("embed"):
        return ADDITIVE
    return OTHER


def group_families(groups: Sequence) -> dict[str, str]:
    """label -> line style for groups (report.runs.Group) whose runs share one encoding class
    (a mechanism's: the one it wraps, encoding.inner)."""
    out = {}
    for group in groups:
        targets = {r.config.get("encoding.inner._target_") or r.config.get("encoding._target_") for r in group.runs}
        if len(targets) == 1 and isinstance(target := targets.pop(), str) and (family := family_of(target)):
            out[group.label] = family
    return out


def styles_for(labels: Sequence[str], families: Mapping[str, str] | None = None) -> dict[str, Style]:
    """label -> Style: a shipped encoding's colour and marker, else a colour picked from the
    label's hash (linear probing past colours already taken in this figure), deterministic for
    a set of labels; the line style from families (group_families), else the shipped
    encoding's, else solid."""
    families = families or {}
    styles = {label: dataclasses.replace(ENCODING_STYLES[label], linestyle=families.get(label, ENCODING_STYLES[label].linestyle))
              for label in labels if label in ENCODING_STYLES}
    taken = {s.color for s in styles.values()}
    for label in sorted(set(labels) - set(styles)):
        h = zlib.crc32(label.encode())
        start = h % len(PALETTE)
        free = [PALETTE[(start + i) % len(PALETTE)] for i in range(len(PALETTE))]
        color = next((c for c in free if c not in taken), free[0])
        taken.add(color)
        styles[label] = Style(color, families.get(label, "-"), _FREE_MARKERS[h % len(_FREE_MARKERS)])
    return styles
