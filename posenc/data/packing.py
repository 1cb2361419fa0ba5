"""Corpus -> tokens -> one flat token array per split on disk (memmap), cached, with where each
document starts (``<split>.starts.npy``), so windows can be cut by document (posenc/data/windows.py).

Packed arrays are cached under ``$POSENC_CACHE`` (default ``$XDG_CACHE_HOME/posenc``, i.e.
``~/.cache/posenc``) in a
directory named by a hash of (corpus, tokenizer, version), so the second run of the same
corpus and tokenizer reads the arrays instead of tokenizing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc.data.batches import Batch
from posenc.data.corpora import SPLITS, Corpus
from posenc.data.windows import Packing, RandomWindows, Windows, fixed_span
from posenc.errors import UserError

#: bump when the packing format or splitting rule changes: old caches are then ignored
#: (2: document starts recorded; the token arrays are the same as version 1's)
DATA_VERSION = 2


@dataclass
class TokenData:
    """The packed corpus: one flat token array per split, where each of its documents starts,
    what is needed for bpb, and how windows are cut from it (``packing``)."""

    train: np.ndarray
    validation: np.ndarray
    meta: dict
    path: Path
    starts: dict[str, np.ndarray]  # split -> (documents,) int64 offsets of document starts, [0] = 0
    packing: str = "concat"

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def batches(self, seq_len: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> RandomWindows:
        """Training batches: random windows of the training split, cut as ``packing`` says."""
        return RandomWindows(self.train, seq_len, batch_size, seed, rank, world_size,
                             Packing(self.packing, self.starts["train"]))

    def validation_windows(self, packing: str | None = None) -> Windows:
        """The validation split with its document starts, cut as ``packing`` says (default: as
        training is): what every evaluator scores."""
        return Windows(self.validation, Packing(packing or self.packing, self.starts["validation"]))

    def validation_batches(self, length: int, n: int, batch_size: int) -> Iterator[tuple[Batch, int]]:
        """Training's periodic validation: the first n windows of ``length`` of the validation
        split, the same in every run (posenc.eval.loss.validator)."""
        windows = self.validation_windows()
        starts = windows.starts(fixed_span(len(self.validation), length, n), length, None)
        return windows.batches(starts, length, batch_size)

    def counts(self) -> dict:
        """What the corpus held once packed, per split: tokens, documents and UTF-8 bytes (summary.json)."""
        return {"name": self.meta["corpus"], **{k: dict(self.meta[k]) for k in ("tokens", "documents", "bytes")}}

    def bytes_per_token(self, split: str = "validation") -> float:
        """UTF-8 bytes of raw text per token, so bpb = loss / ln 2 / bytes_per_token."""
        return self.meta["bytes"][split] / max(1, self.meta["tokens"][split])


def cache_root() -> Path:
    """$POSENC_CACHE, else $XDG_CACHE_HOME/posenc, else ~/.cache/posenc."""
    if os.environ.get("POSENC_CACHE"):
        return Path(os.environ["POSENC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posenc"


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
    starts = {s: np.load(directory / f"{s}.starts.npy") for s in SPLITS}
    return TokenData(train=arrays["train"], validation=arrays["validation"], meta=meta, path=directory,
                     starts=starts, packing=getattr(corpus, "packing", "concat"))


def _build(corpus: Corpus, tokenizer, directory: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    directory.parent.mkdir(parents=True, exist_ok=True)
    # build in a temporary sibling and rename: a killed build never leaves a half cache
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        if corpus.streams:  # too large to hold: tokenized as it is read
            _build_streamed(corpus, tokenizer, tmp)
        else:
            _build_whole(corpus, tokenizer, tmp)
        try:
            tmp.rename(directory)
        except OSError:  # another process built it first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _new_meta(corpus: Corpus, tokenizer) -> dict:
    return {"corpus": corpus.name, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
            "dtype": _token_dtype(tokenizer.vocab_size).name, "version": DATA_VERSION, "tokens": {}, "bytes": {},
            "documents": {}}


def _with_eos(tokenizer, ids: list) -> list:
    """Each document's ids with the tokenizer's end-of-text id appended, where it has one."""
    eos = getattr(tokenizer, "eos_id", None)
    return ids if eos is None else [np.append(np.asarray(x, dtype=np.int64), eos) for x in ids]


class SplitWriter:
    """One split's packed file written as documents arrive, never held whole: the tokens
    (``<split>.bin``), where each document starts (``<split>.starts.npy``) and its counts."""

    def __init__(self, tmp: Path, split: str, dtype: np.dtype) -> None:
        self.tmp, self.split, self.dtype = tmp, split, dtype
        self.file = open(tmp / f"{split}.bin", "wb")
        self.tokens, self.bytes, self.documents, self.starts = 0, 0, 0, []

    def add(self, ids: list, texts: list[str]) -> None:
        for x in ids:
            if len(x):  # an empty document starts nowhere
                self.starts.append(self.tokens)
            np.asarray(x).astype(self.dtype).tofile(self.file)
            self.tokens += len(x)
        self.bytes += sum(len(t.encode("utf-8")) for t in texts)
        self.documents += len(texts)

    def close(self, meta: dict) -> None:
        if self.tokens == 0:  # as a memmap needs: one token, never read (no window fits)
            np.zeros(1, dtype=self.dtype).tofile(self.file)
        self.file.close()
        np.save(self.tmp / f"{self.split}.starts.npy", np.asarray(self.starts or [0], dtype=np.int64))
        meta["tokens"][self.split], meta["bytes"][self.split] = self.tokens, self.bytes
        meta["documents"][self.split] = self.documents


def _build_streamed(corpus: Corpus, tokenizer, tmp: Path, batch: int = 1024) -> None:
    """Tokenize and pack a corpus as it streams (corpus.stream_documents): each split appended to
    its file ``batch`` documents at a time; a tokenizer that learns reads the train split first,
    in a pass of its own. The same files as _build_whole writes from the same documents."""
    tokenizer.fit((text for split, text in corpus.stream_documents() if split == "train"), tmp)
    meta = _new_meta(corpus, tokenizer)
    writers = {s: SplitWriter(tmp, s, np.dtype(meta["dtype"])) for s in SPLITS}
    pending: dict[str, list[str]] = {s: [] for s in SPLITS}
    for split, text in corpus.stream_documents():
        pending[split].append(text)
        if len(pending[split]) == batch:
            writers[split].add(_with_eos(tokenizer, tokenizer.encode_batch(pending[split])), pending[split])
            pending[split] = []
    for split, texts in pending.items():
        if texts:
            writers[split].add(_with_eos(tokenizer, tokenizer.encode_batch(texts)), texts)
        writers[split].close(meta)
    for split in SPLITS:
        if meta["documents"][split] == 0:
            raise UserError(f"dataset '{corpus.name}' streamed no {split} document — "
                            + ("raise dataset.val_fraction, or give a validation split (dataset.data_files="
                               "{train: [...], validation: [...]})" if split == "validation" else "check the data"))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))


def _build_whole(corpus: Corpus, tokenizer, tmp: Path) -> None:
    """Tokenize and pack a corpus read whole (corpus.documents, split by Corpus.split)."""
    splits = corpus.split(corpus.documents())
    tokenizer.fit((t for t in splits["train"]["text"]), tmp)

    def tokenize(batch: dict) -> dict:
        return {"ids": _with_eos(tokenizer, tokenizer.encode_batch(batch["text"])),
                "n_bytes": [len(t.encode("utf-8")) for t in batch["text"]]}

    meta = _new_meta(corpus, tokenizer)
    dtype = np.dtype(meta["dtype"])
    for split in SPLITS:
        tokenized = splits[split].map(tokenize, batched=True, remove_columns=splits[split].column_names,
                                      keep_in_memory=True, desc=f"tokenizing {split}")
        n = sum(len(x) for x in tokenized["ids"]) if len(tokenized) else 0
        arr = np.memmap(tmp / f"{split}.bin", dtype=dtype, mode="w+", shape=(max(n, 1),))
        offset, starts = 0, []
        for chunk in tokenized.with_format("numpy").iter(batch_size=1024):
            for ids in chunk["ids"]:
                if len(ids):  # an empty document starts nowhere
                    starts.append(offset)
                arr[offset : offset + len(ids)] = ids
                offset += len(ids)
        arr.flush()
        del arr
        np.save(tmp / f"{split}.starts.npy", np.asarray(starts or [0], dtype=np.int64))
        meta["tokens"][split] = n
        meta["bytes"][split] = int(sum(tokenized["n_bytes"]))
        meta["documents"][split] = len(tokenized)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
