"""One look per encoding in every figure: a fixed colour, line style and marker.

The line style says the family (the encoding's hooks, docs/architecture.md): solid for rotary
(`transform_qk`), dashed for additive (`embed`), dash-dot for a bias on the scores (`position_bias`), dotted
for none or a content-dependent one. A label that is not an encoding (grouping by `encoding.base`,
`model.flavor`, ...) gets a colour from its name's hash, probing for a free one, so the same
label keeps its colour in every figure of a report and, mostly, across reports.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass


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


def styles_for(labels: Sequence[str]) -> dict[str, Style]:
    """label -> Style: an encoding's own, else a colour picked from the label's hash (linear
    probing past colours already taken in this figure), deterministic for a set of labels."""
    styles = {label: ENCODING_STYLES[label] for label in labels if label in ENCODING_STYLES}
    taken = {s.color for s in styles.values()}
    for label in sorted(set(labels) - set(styles)):
        h = zlib.crc32(label.encode())
        start = h % len(PALETTE)
        free = [PALETTE[(start + i) % len(PALETTE)] for i in range(len(PALETTE))]
        color = next((c for c in free if c not in taken), free[0])
        taken.add(color)
        styles[label] = Style(color, "-", _FREE_MARKERS[h % len(_FREE_MARKERS)])
    return styles
