"""One look per encoding in every figure: a colour, a line style and a marker, colour-blind safe.

The colours are Okabe & Ito's (then Paul Tol's muted ones past eight groups): safe for the common
colour-vision deficiencies, and ordered so that neighbouring groups differ in hue, never two browns
side by side. Every group also has its own marker, drawn open, so curves that lie on top of each
other (three RoPE bases that train alike) stay visible by their markers even where a line hides
another.

The line style says the family, derived from the hooks the group's encoding class overrides
(docs/architecture.md), never from its name: solid for rotary (`transform_qk`,
`rotary_frequencies`), dash-dot for a bias on the scores (`position_bias` or `distance_bias`), dashed for additive
(`embed`), dotted for none or a content-dependent one; a mechanism (`encoding.inner`) is drawn as
the encoding it wraps. Where every group of a figure is of one family (a sweep of one encoding's
option) the family tells nothing apart, and each group gets a line style of its own. The shipped
encodings keep a fixed colour and marker; any other label (a plugin's encoding, grouping by
`encoding.base`, `model.flavor`, ...) takes the next free colour and marker in the labels' natural
order (numbers by value), so the same labels get the same look in every figure of a report.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Style:
    color: str
    linestyle: str
    marker: str

    def line(self) -> dict:
        """Keyword arguments for Axes.plot / errorbar: open markers, so a marker drawn over another
        of another shape leaves both visible where curves coincide."""
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker, "markerfacecolor": "none"}


# colour-blind safe: Okabe & Ito's eight (Color Universal Design), ordered so neighbours differ in hue,
# then Paul Tol's muted scheme for figures with more groups than seven, yellow (weak on white) late
OKABE_ITO = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#56b4e9", "#cc79a7", "#000000")
TOL_MUTED = ("#332288", "#999933", "#882255", "#44aa99", "#aa4499", "#117733", "#888888")
LATE = ("#f0e442", "#cc6677")  # Okabe & Ito's yellow, Tol's rose
PALETTE = (*OKABE_ITO, *TOL_MUTED[:-1], *LATE, TOL_MUTED[-1])

ROTARY, ADDITIVE, BIAS, OTHER = "-", "--", "-.", ":"
#: line styles that tell apart groups of one family (a sweep of RoPE bases): the family's own first
LINESTYLES = (ROTARY, ADDITIVE, BIAS, OTHER, (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))

ENCODING_STYLES: dict[str, Style] = {
    "rope": Style(OKABE_ITO[0], ROTARY, "o"),
    "xpos": Style(OKABE_ITO[4], ROTARY, "v"),
    "p_rope": Style(TOL_MUTED[0], ROTARY, "^"),
    "rope_nope": Style(TOL_MUTED[4], ROTARY, "P"),
    "sinusoidal": Style(OKABE_ITO[1], ADDITIVE, "s"),
    "learned": Style(OKABE_ITO[6], ADDITIVE, "D"),
    "alibi": Style(OKABE_ITO[2], BIAS, "X"),
    "t5_bias": Style(OKABE_ITO[3], BIAS, "<"),
    "kerple": Style(TOL_MUTED[1], BIAS, ">"),
    "fire": Style(TOL_MUTED[2], BIAS, "h"),
    "nope": Style(TOL_MUTED[6], OTHER, "p"),
    "cope": Style(OKABE_ITO[5], OTHER, "*"),
}

FREE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d", "H", "8")


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
    """label -> Style, the same for a set of labels in any order: a shipped encoding's colour and
    marker; any other label (a RoPE base, a flavour, a plug-in) the next colour and marker of the
    palette not taken in this figure, in the labels' natural order (numbers by value), so neighbours
    in the legend differ in hue and shape. The line style is the family (families: group_families,
    else the shipped encoding's, else solid) where the figure mixes families; where every label has
    one family it says nothing, and each label gets a line style of its own instead."""
    families = families or {}
    ordered = sorted(dict.fromkeys(labels), key=natural_key)
    family = {label: families.get(label, ENCODING_STYLES[label].linestyle if label in ENCODING_STYLES else ROTARY)
              for label in ordered}
    one_family = len(set(family.values())) == 1 and len(ordered) > 1
    styles = {label: dataclasses.replace(ENCODING_STYLES[label], linestyle=family[label])
              for label in ordered if label in ENCODING_STYLES}
    colours = iter(c for c in PALETTE if c not in {s.color for s in styles.values()})
    markers = iter(m for m in FREE_MARKERS if m not in {s.marker for s in styles.values()})
    for label in ordered:
        if label not in styles:
            styles[label] = Style(next(colours, PALETTE[len(styles) % len(PALETTE)]), family[label],
                                  next(markers, FREE_MARKERS[len(styles) % len(FREE_MARKERS)]))
    if one_family:
        for i, label in enumerate(ordered):
            styles[label] = dataclasses.replace(styles[label], linestyle=LINESTYLES[i % len(LINESTYLES)])
    return styles


def natural_key(label: str) -> tuple:
    """'100' < '1e4' < '5e5' by value, 'rope' < 'rope, seq_len=64' as text; numbers before words."""
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)
