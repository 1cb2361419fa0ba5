"""Tokenizers: text -> token ids. ``byte`` needs nothing; the others are built on it.

Every tokenizer has a ``name``, a ``vocab_size``, ``encode_batch`` (used inside
``datasets.map(batched=True)``), ``decode``, and a ``fingerprint`` that keys the packed
data cache. ``fit`` is called once with the training split for tokenizers that learn.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, no download, no training, bpb == loss / ln 2."""

    name = "byte"
    vocab_size = 256
    eos_id: int | None = None

    def __init__(self, name: str = "byte") -> None:
        self.name = name

    def fit(self, texts: Iterable[str], cache_dir: Path) -> None:
        """Nothing to learn."""

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        return "byte-v1"
