"""Tokenizers: text -> token ids. ``byte`` needs nothing; the others are built on it.

Every tokenizer has a ``name``, a ``vocab_size``, ``encode_batch`` (used inside
``datasets.map(batched=True)``), ``decode``, and a ``fingerprint`` that keys the packed
data cache. ``fit`` is called once with the training split for tokenizers that learn.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from posenc.data import hub

#: how the byte tokenizer's document separator (id 256) prints
SEPARATOR_TEXT = "\n<|endoftext|>\n"


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, no download, no training, bpb == loss / ln 2.

    ``separator``: end every document with token 256 (vocab 257), as the BPE tokenizers end
    theirs with <|endoftext|>, so that a window across documents shows the model where one ends.
    Off by default: the packed stream, and every earlier result, stay byte for byte the same."""

    name = "byte"

    def __init__(self, name: str = "byte", separator: bool = False) -> None:
        self.name = name
        self.separator = bool(separator)
        self.vocab_size = 257 if self.separator else 256
        self.eos_id: int | None = 256 if self.separator else None

    def fit(self, texts: Iterable[str], cache_dir: Path) -> None:
        """Nothing to learn."""

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        parts, run = [], bytearray()
        for i in ids:
            if int(i) < 256:
                run.append(int(i))
            else:  # the document separator
                parts += [run.decode("utf-8", errors="replace"), SEPARATOR_TEXT]
                run = bytearray()
        return "".join(parts) + run.decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        return "byte-sep-v1" if self.separator else "byte-v1"


class _HFTokenizer:
    """A ``tokenizers.Tokenizer`` saved as tokenizer.json beside the packed data, so a cached
    corpus is read back with exactly the tokenizer that packed it (and offline)."""

    name = "hf"
    eos_token = "<|endoftext|>"
    FILE = "tokenizer.json"

    def __init__(self) -> None:
        self.tokenizer = None

    def _set(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.token_to_id(self.eos_token)

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            raise RuntimeError(f"tokenizer '{self.name}' is used before fit() or load()")
        return self.tokenizer.get_vocab_size()

    def load(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        self._set(Tokenizer.from_file(str(Path(directory) / self.FILE)))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


class BPETokenizer(_HFTokenizer):
    """Byte-level BPE (GPT-2's scheme: bytes mapped to printable symbols, merges learned on
    the training split only), trained once per corpus with the ``tokenizers`` library."""

    def __init__(self, vocab_size: int = 4096, name: str = "bpe", min_frequency: int = 2) -> None:
        super().__init__()
        if int(vocab_size) < 257:
            raise ValueError(f"tokenizer.vocab_size must be >= 257 (256 bytes + end of text), got {vocab_size}")
        self.name = name
        self.target_vocab_size = int(vocab_size)
        self.min_frequency = int(min_frequency)

    def fit(self, texts: Iterable[str], cache_dir: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=self.target_vocab_size, min_frequency=self.min_frequency,
                                      special_tokens=[self.eos_token], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        tokenizer.save(str(Path(cache_dir) / self.FILE))
        self._set(tokenizer)

    def fingerprint(self) -> str:
        return f"bpe-v1:{self.target_vocab_size}:{self.min_frequency}"


class PretrainedTokenizer(_HFTokenizer):
    """A pretrained tokenizer from the Hub (``gpt2``: 50,257 byte-level BPE tokens), fetched
    once when the corpus is packed and then read from the packed data's cache."""

    def __init__(self, name: str = "gpt2", repo: str = "gpt2") -> None:
        super().__init__()
        self.name = name
        self.repo = repo

    def fit(self, texts: Iterable[str], cache_dir: Path) -> None:
        from tokenizers import Tokenizer


        what = f"tokenizer '{self.name}' ({self.repo})"
        hub.check(what)
        try:
            tokenizer = Tokenizer.from_pretrained(self.repo)
        except Exception as e:  # noqa: BLE001 - offline misses surface as several error types
            raise hub.unavailable(what) from e
        tokenizer.save(str(Path(cache_dir) / self.FILE))
        self._set(tokenizer)

    def fingerprint(self) -> str:
        return f"pretrained-v1:{self.repo}"
