"""Corpus -> documents (a ``datasets.Dataset``) -> split by document -> tokens -> one flat
token array per split on disk (memmap) -> batches.

Packed arrays are cached under ``$POSENC_CACHE`` (default ``~/.cache/posenc``) in a
directory named by a hash of (corpus, tokenizer, version), so the second run of the same
corpus and tokenizer reads the arrays instead of tokenizing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from posenc.errors import UserError

#: bump when the packing format or splitting rule changes: old caches are then ignored
DATA_VERSION = 1
SPLITS = ("train", "validation")


# --- corpora ------------------------------------------------------------------------------


class Corpus:
    """A source of documents. ``documents`` returns a Dataset with columns text, source."""

    name: str = "corpus"

    def __init__(self, name: str, val_fraction: float = 0.05) -> None:
        if not 0.0 < val_fraction < 1.0:
            raise UserError(f"dataset.val_fraction must be in (0, 1), got {val_fraction}")
        self.name = name
        self.val_fraction = float(val_fraction)

    def documents(self):  # -> datasets.Dataset | datasets.DatasetDict
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def split(self, docs) -> "datasets.DatasetDict":  # noqa: F821
        """Deterministic split by document: a stable hash of the source picks validation."""
        import datasets

        if isinstance(docs, datasets.DatasetDict):
            return docs  # the corpus ships its own split
        if len(docs) < 2:
            raise UserError(
                f"dataset '{self.name}' has {len(docs)} document(s); it needs at least two to "
                f"split into train and validation — add more text"
            )
        threshold = int(self.val_fraction * 10_000)
        is_val = [zlib.crc32(s.encode()) % 10_000 < threshold for s in docs["source"]]
        if all(is_val) or not any(is_val):  # few documents: fall back to the last one(s)
            n_val = max(1, round(self.val_fraction * len(docs)))
            is_val = [i >= len(docs) - n_val for i in range(len(docs))]
        val_idx = [i for i, v in enumerate(is_val) if v]
        train_idx = [i for i, v in enumerate(is_val) if not v]
        return datasets.DatasetDict(train=docs.select(train_idx), validation=docs.select(val_idx))


def _is_test_path(parts: tuple[str, ...]) -> bool:
    return any(p in ("test", "tests", "idle_test") for p in parts)


class PyStdlib(Corpus):
    """The running interpreter's standard library source (tests excluded) plus pydoc topics:
    ~11 MB of real text that every machine has, no network."""

    def __init__(self, name: str = "pystdlib", val_fraction: float = 0.05) -> None:
        super().__init__(name, val_fraction)
        self.root = Path(sysconfig.get_paths()["stdlib"])

    def files(self) -> list[Path]:
        out = []
        for f in sorted(self.root.rglob("*.py")):
            parts = f.relative_to(self.root).parts
            if parts[0] in ("site-packages", "dist-packages") or _is_test_path(parts[:-1]):
                continue
            if f.name.startswith("test_"):
                continue
            out.append(f)
        return out

    def documents(self):
        import datasets

        texts, sources = [], []
        for f in self.files():
            texts.append(f.read_text(encoding="utf-8", errors="replace"))
            sources.append(str(f.relative_to(self.root)))
        try:
            from pydoc_data.topics import topics
        except ImportError:  # some distributions strip pydoc_data
            topics = {}
        for key in sorted(topics):
            texts.append(topics[key])
            sources.append(f"pydoc_topics/{key}")
        return datasets.Dataset.from_dict({"text": texts, "source": sources})

    def fingerprint(self) -> str:
        return f"pystdlib:{sys.version}:{self.root}:{self.val_fraction}"


class TextFiles(Corpus):
    """The user's own text files. Each file is cut into blocks of ``lines_per_doc`` lines so
    that even a single file splits into train and validation by block."""

    def __init__(
        self, files: list[str], name: str = "text", val_fraction: float = 0.05, lines_per_doc: int = 200
    ) -> None:
        super().__init__(name, val_fraction)
        if not files:
            raise UserError("dataset=text needs files: dataset.files=[path/a.txt,path/b.txt]")
        self.paths = [Path(os.path.expanduser(str(f))) for f in files]
        for p in self.paths:
            if not p.is_file():
                raise UserError(f"dataset.files: '{p}' does not exist or is not a file — check the path")
            if not os.access(p, os.R_OK):
                raise UserError(f"dataset.files: '{p}' is not readable — check its permissions")
        self.lines_per_doc = int(lines_per_doc)

    def documents(self):
        import datasets

        texts, sources = [], []
        for p in self.paths:
            try:
                lines = p.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
            except OSError as e:
                raise UserError(f"dataset.files: cannot read '{p}' ({e.strerror}) — check the file") from e
            for i in range(0, len(lines), self.lines_per_doc):
                texts.append("".join(lines[i : i + self.lines_per_doc]))
                sources.append(f"{p}:{i}")
        return datasets.Dataset.from_dict({"text": texts, "source": sources})

    def fingerprint(self) -> str:
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in self.paths]
        return f"text:{stats}:{self.val_fraction}:{self.lines_per_doc}"


# --- packed token arrays ------------------------------------------------------------------


@dataclass
class TokenData:
    """The packed corpus: one flat token array per split, and what is needed for bpb."""

    train: np.ndarray
    validation: np.ndarray
    meta: dict
    path: Path

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def bytes_per_token(self, split: str = "validation") -> float:
        """UTF-8 bytes of raw text per token, so bpb = loss / ln 2 / bytes_per_token."""
        return self.meta["bytes"][split] / max(1, self.meta["tokens"][split])


def cache_root() -> Path:
    return Path(os.environ.get("POSENC_CACHE", Path.home() / ".cache" / "posenc"))


def cache_key(corpus: Corpus, tokenizer) -> str:
    key = f"{corpus.fingerprint()}|{tokenizer.fingerprint()}|v{DATA_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def load_tokens(corpus: Corpus, tokenizer, log=print) -> TokenData:
    """Return the packed arrays for (corpus, tokenizer), building and caching them once."""
    directory = cache_root() / f"{corpus.name}-{tokenizer.name}-{cache_key(corpus, tokenizer)}"
    if not (directory / "meta.json").exists():
        log(f"tokenizing {corpus.name} with {tokenizer.name} into {directory} (once)")
        _build(corpus, tokenizer, directory)
    meta = json.loads((directory / "meta.json").read_text())
    if hasattr(tokenizer, "load"):  # tokenizers that learned something read it back
        tokenizer.load(directory)
    dtype = np.dtype(meta["dtype"])
    arrays = {s: np.memmap(directory / f"{s}.bin", dtype=dtype, mode="r") for s in SPLITS}
    return TokenData(train=arrays["train"], validation=arrays["validation"], meta=meta, path=directory)


def _build(corpus: Corpus, tokenizer, directory: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    splits = corpus.split(corpus.documents())
    directory.parent.mkdir(parents=True, exist_ok=True)
    # build in a temporary sibling and rename: a killed build never leaves a half cache
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        tokenizer.fit((t for t in splits["train"]["text"]), tmp)
        eos = getattr(tokenizer, "eos_id", None)

        def tokenize(batch: dict) -> dict:
            ids = tokenizer.encode_batch(batch["text"])
            if eos is not None:
                ids = [np.append(np.asarray(x, dtype=np.int64), eos) for x in ids]
            return {"ids": ids, "n_bytes": [len(t.encode("utf-8")) for t in batch["text"]]}

        dtype = _token_dtype(tokenizer.vocab_size)
        meta: dict = {"corpus": corpus.name, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
                      "dtype": dtype.name, "version": DATA_VERSION, "tokens": {}, "bytes": {}, "documents": {}}
        for split in SPLITS:
            tokenized = splits[split].map(tokenize, batched=True, remove_columns=splits[split].column_names,
                                          keep_in_memory=True, desc=f"tokenizing {split}")
            n = sum(len(x) for x in tokenized["ids"]) if len(tokenized) else 0
            arr = np.memmap(tmp / f"{split}.bin", dtype=dtype, mode="w+", shape=(max(n, 1),))
            offset = 0
            for chunk in tokenized.with_format("numpy").iter(batch_size=1024):
                for ids in chunk["ids"]:
                    arr[offset : offset + len(ids)] = ids
                    offset += len(ids)
            arr.flush()
            del arr
            meta["tokens"][split] = n
            meta["bytes"][split] = int(sum(tokenized["n_bytes"]))
            meta["documents"][split] = len(tokenized)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        try:
            tmp.rename(directory)
        except OSError:  # another process built it first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --- batches ------------------------------------------------------------------------------


class RandomWindows:
    """Training batches: random windows of seq_len+1 tokens (x = w[:-1], y = w[1:]).

    Offsets come from a seeded torch.Generator whose state can be saved and restored, so a
    resumed run draws the same batches as an uninterrupted one.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1) -> None:
        if len(tokens) < seq_len + 2:
            raise UserError(
                f"the training split has {len(tokens)} tokens, fewer than one window of "
                f"trainer.seq_len+1={seq_len + 1} — use a larger corpus or a smaller trainer.seq_len"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[Tensor, Tensor]:
        """(B, T) inputs and targets, int64, on CPU."""
        # every rank draws the global batch and keeps its own shard: same data as one process
        ix = torch.randint(0, len(self.tokens) - self.seq_len - 1,
                           (self.batch_size * self.world_size,), generator=self.generator)
        ix = ix[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        w = torch.from_numpy(np.stack([self.tokens[i : i + self.seq_len + 1] for i in ix.tolist()]).astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def eval_windows(tokens: np.ndarray, length: int, max_windows: int | None) -> np.ndarray:
    """Start offsets of the fixed, non-overlapping evaluation windows of ``length`` targets:
    0, length, 2·length, ... (each window reads length+1 tokens). The same for every run."""
    n = (len(tokens) - 1) // length
    if max_windows is not None:
        n = min(n, max_windows)
    return np.arange(n, dtype=np.int64) * length


def window_batches(tokens: np.ndarray, starts: np.ndarray, length: int, batch_size: int):
    """Yield (x, y) int64 batches of shape (b, length) for the given window starts."""
    for i in range(0, len(starts), batch_size):
        w = np.stack([tokens[s : s + length + 1] for s in starts[i : i + batch_size]]).astype(np.int64)
        w = torch.from_numpy(w)
        yield w[:, :-1], w[:, 1:]
