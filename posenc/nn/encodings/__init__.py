"""Positional encodings: one module each, all behind the interface in base.py."""

from posenc.nn.encodings.base import NoPE, PositionalEncoding, PositionOutOfRange

__all__ = ["NoPE", "PositionalEncoding", "PositionOutOfRange"]
