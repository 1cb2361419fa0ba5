"""NoPE: no positional encoding. The base class already does nothing in every hook."""

from posenc.nn.encodings.base import NoPE

__all__ = ["NoPE"]
