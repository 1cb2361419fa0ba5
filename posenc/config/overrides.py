"""One override parser: Hydra's own, for every command that reads ``key=value`` arguments."""

from __future__ import annotations

from typing import Any, NamedTuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override


class ParsedOverride(NamedTuple):
    key: str            # 'trainer.max_steps', or a group: 'encoding', 'hydra/launcher'
    value: Any          # as Hydra types it: 100 -> 100, 1e6 -> 1000000.0; a sweep -> its list
    override: Override  # Hydra's own: .is_add(), .is_sweep_override(), .input_line, ...


def parse_overrides(overrides: list[str]) -> list[ParsedOverride]:
    """Overrides as Hydra's OverridesParser reads them (a syntax error is Hydra's
    OverrideParseException). A choice or range sweep's value is the list of its values."""
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    out = []
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        value = o.value()
        if isinstance(value, (ChoiceSweep, RangeSweep)):
            value = list(o.sweep_iterator())
        out.append(ParsedOverride(o.key_or_group, value, o))
    return out
