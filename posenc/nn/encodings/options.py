"""What an encoding records about itself: the arguments its constructor was called with (its
``options()`` by default) and the encodings nested in it (a mechanism's ``inner``, a layout's
kinds), whose ``param_groups`` are their own. Used by posenc/nn/encodings/base.py, which
re-exports them."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posenc.nn.encodings.base import PositionalEncoding

#: constructor arguments the builder passes (posenc/build.py) or that name the encoding: not options
BUILDER_ARGUMENTS = ("self", "d_model", "n_head", "name", "n_layer", "train_len")


def constructor_arguments(encoding: PositionalEncoding) -> dict[str, object]:
    """The plain-valued arguments of the outermost ``__init__`` building encoding (the frames that
    called this one through ``super().__init__``), but BUILDER_ARGUMENTS: options()' default, so
    an encoding's options are recorded without it having to list them."""
    frame, outer = inspect.currentframe(), None
    frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None  # past PositionalEncoding.__init__
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is encoding:
        outer, frame = frame, frame.f_back
    if outer is None:
        return {}
    plain = (bool, int, float, str)
    out: dict[str, object] = {}
    for arg, p in inspect.signature(type(encoding).__init__).parameters.items():
        if arg in BUILDER_ARGUMENTS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or arg not in outer.f_locals:
            continue
        value = outer.f_locals[arg]
        if value is None or isinstance(value, plain):
            out[arg] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, plain) for v in value):
            out[arg] = list(value)
    return out


def outermost_encodings(encoding: PositionalEncoding) -> list[PositionalEncoding]:
    """The encodings inside encoding that no other encoding inside it contains (what its
    ``param_groups`` hands over to their own)."""
    # here, not at the top: base imports this module
    from posenc.nn.encodings.base import PositionalEncoding

    found: list[tuple[str, PositionalEncoding]] = []
    for name, module in encoding.named_modules():
        if module is encoding or not isinstance(module, PositionalEncoding):
            continue
        if not any(name.startswith(outer + ".") for outer, _ in found):
            found.append((name, module))
    return [module for _, module in found]
