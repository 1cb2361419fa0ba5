"""Positional encodings: one module each, all behind the interface in base.py."""

from posenc.encodings.base import NoPE, PositionalEncoding, PositionOutOfRange

__all__ = ["NoPE", "PositionalEncoding", "PositionOutOfRange"]
