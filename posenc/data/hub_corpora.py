"""Corpora through ``datasets``: the Hub's (wikitext, TinyStories, FineWeb-Edu) and a lab's own.

They feed the same packing and cache as the local corpora (posenc.data): ``documents``
returns a DatasetDict (train, validation) when the dataset ships both splits, else one
Dataset that ``Corpus.split`` divides deterministically. ``data_files`` points the same
code at local parquet, json/jsonl, text or csv files (a lab's corpus, a mirror, a test fixture)
instead of the Hub, ``load_from_disk`` at a folder ``datasets``' ``save_to_disk`` wrote
(``dataset=hf``: conf/dataset/hf.yaml). With ``streaming`` the corpus is read as a stream
(``stream_documents``) and tokenized as it is read, never held whole: a corpus larger than
memory; a stream of one split is divided by the same hash of each document's name as a whole
one, so its validation split is fixed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from posenc.data import hub
from posenc.data.corpora import SPLITS, Corpus
from posenc.errors import UserError

BUILDERS = {".parquet": "parquet", ".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def _builder(files: dict[str, list[str]]) -> str:
    suffixes = {Path(f).suffix for fs in files.values() for f in fs}
    kinds = {BUILDERS.get(s) for s in suffixes}
    if len(kinds) != 1 or None in kinds:
        raise UserError(f"dataset.data_files: cannot read files with suffix {sorted(suffixes)} together — "
                        f"use one of {', '.join(BUILDERS)}")
    return kinds.pop()


def sources(name: str, path: str | None, data_files, load_from_disk: str | None
            ) -> tuple[dict[str, list[str]] | None, Path | None]:
    """Where a HubCorpus reads from, checked without reading it (no `datasets`, no torch imported:
    `posenc train` asks before it makes a run directory, cli/hydra_commands.check_run): its local
    files by split, each an existing file of one kind posenc reads, or its save_to_disk folder; one
    of path, data_files and load_from_disk, else one line saying which to set."""
    files = _local_files(data_files)
    disk = _disk_folder(load_from_disk)
    if not (path or files or disk):
        raise UserError(f"dataset '{name}' reads nothing — set dataset.data_files=[corpus.jsonl] (parquet, json/jsonl, "
                        f"text or csv), dataset.load_from_disk=<a save_to_disk folder> or dataset.path=<hub dataset>")
    if disk and files:
        raise UserError("dataset.data_files and dataset.load_from_disk name two corpora — set one of them")
    return files, disk


def _local_files(data_files) -> dict[str, list[str]] | None:
    if not data_files:
        return None
    files = dict(data_files) if hasattr(data_files, "items") else {"train": list(data_files)}
    files = {k: [str(Path(f).expanduser()) for f in ([v] if isinstance(v, str) else v)] for k, v in files.items()}
    for f in (f for fs in files.values() for f in fs):
        if not Path(f).is_file():
            raise UserError(f"dataset.data_files: '{f}' does not exist — check the path")
    _builder(files)  # one kind of file, one posenc can read: said now, not when training starts
    return files


def _disk_folder(folder: str | None) -> Path | None:
    if not folder:
        return None
    path = Path(str(folder)).expanduser()
    if not ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        raise UserError(f"dataset.load_from_disk: '{path}' is not a folder `datasets` save_to_disk wrote "
                        f"(no dataset_dict.json or state.json) — point at the folder passed to save_to_disk")
    return path


class HubCorpus(Corpus):
    """A ``datasets`` dataset with a text column: from the Hub (``path``, ``config``), from local
    files (``data_files``) or from a ``save_to_disk`` folder (``load_from_disk``), one of the three.

    Args:
        path, config, revision: what ``datasets.load_dataset`` fetches from the Hub.
        text_column: the column holding the text.
        splits: our split name -> the dataset's (e.g. validation: validation); a dataset with
            only a train split is split by document hash instead.
        streaming: read the dataset as a stream, tokenized as it is read (FineWeb-Edu, or any
            corpus larger than memory: nothing is held whole).
        max_tokens: stop reading after this many UTF-8 bytes of text (= byte-level tokens),
            counted before tokenization so the cap does not depend on the tokenizer.
        max_documents: stop after this many documents per split.
        data_files: local files instead of the Hub (parquet, json/jsonl, text or csv, one kind):
            a list, or {train: [...], validation: [...]}.
        load_from_disk: a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.
    """

    def __init__(self, name: str, path: str | None = None, config: str | None = None, revision: str | None = None,
                 text_column: str = "text", splits: dict | None = None, streaming: bool = False,
                 max_tokens: int | None = None, max_documents: int | None = None,
                 data_files=None, val_fraction: float = 0.05, packing: str = "concat",
                 load_from_disk: str | None = None) -> None:
        super().__init__(name, val_fraction, packing)
        self.path, self.config, self.revision = path, config, revision
        self.text_column = text_column
        self.splits = dict(splits or {})
        self.streaming = bool(streaming)
        self.max_tokens = int(max_tokens) if max_tokens else None
        self.max_documents = int(max_documents) if max_documents else None
        self.data_files, self.disk = sources(name, path, data_files, load_from_disk)

    # --- loading ----------------------------------------------------------------------
    def _load(self):
        """The dataset as a dict of splits (a stream of each where ``streaming``)."""
        import datasets

        if self.disk is not None:  # memory-mapped Arrow files: no more held in memory than is read
            loaded = datasets.load_from_disk(str(self.disk))
            if isinstance(loaded, datasets.Dataset):
                loaded = datasets.DatasetDict(train=loaded)
            return datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in loaded.items()}) \
                if self.streaming else loaded
        if self.data_files is not None:  # local files: the same code, no network
            return datasets.load_dataset(_builder(self.data_files), data_files=self.data_files,
                                         streaming=self.streaming)
        what = f"dataset '{self.name}' ({self.path}{'/' + self.config if self.config else ''})"
        hub.check(what)
        try:
            return datasets.load_dataset(self.path, self.config, revision=self.revision, streaming=self.streaming)
        except (ConnectionError, OSError) as e:
            raise hub.unavailable(what) from e
        except Exception as e:  # noqa: BLE001 - datasets wraps offline misses in many types
            if hub.offline() or "offline" in str(e).lower() or "couldn't reach" in str(e).lower():
                raise hub.unavailable(what) from e
            raise

    def _rows(self, rows: Iterable[dict], split: str) -> Iterator[tuple[str, str]]:
        """(text, source) of up to max_documents non-empty texts / max_tokens bytes of rows."""
        documents, n_bytes = 0, 0
        for i, row in enumerate(rows):
            text = row[self.text_column]
            if not text or not text.strip():
                continue  # wikitext's blank lines carry no text
            yield text, f"{split}/{row.get('id', i)}"
            documents += 1
            n_bytes += len(text.encode("utf-8"))
            if (self.max_documents and documents >= self.max_documents) or (self.max_tokens and n_bytes >= self.max_tokens):
                return

    def _take(self, rows, split: str):
        """_rows as a Dataset(text, source)."""
        import datasets

        texts, sources = [], []
        for text, source in self._rows(rows, split):
            texts.append(text)
            sources.append(source)
        return datasets.Dataset.from_dict({"text": texts, "source": sources})

    def _opened(self) -> tuple[object, dict[str, str]]:
        """The loaded splits, checked to hold the text column, and which of ours each one is
        (both ours, or the train split alone, to be divided by hash)."""
        loaded = self._load()
        first = loaded[next(iter(loaded))]
        columns = first.column_names
        if columns is None and self.streaming:  # a stream of files whose columns are not known until read
            columns = list(next(iter(first), {}).keys()) or [self.text_column]
        if self.text_column not in columns:
            raise UserError(f"dataset '{self.name}' has no column '{self.text_column}' (it has {', '.join(columns)}) "
                            f"— set dataset.text_column")
        wanted = {ours: theirs for ours, theirs in self.splits.items() if theirs in loaded}
        if set(wanted) != set(SPLITS):
            train = self.splits.get("train", "train")
            if train not in loaded:
                raise UserError(f"dataset '{self.name}' has no split '{train}' (it has {', '.join(loaded)}) "
                                f"— set dataset.splits.train")
            wanted = {"train": train}
        return loaded, wanted

    def documents(self):
        import datasets

        loaded, wanted = self._opened()
        if len(wanted) == 2:
            return datasets.DatasetDict({ours: self._take(loaded[theirs], theirs) for ours, theirs in wanted.items()})
        return self._take(loaded[wanted["train"]], "train")

    @property
    def streams(self) -> bool:
        return self.streaming

    def stream_documents(self) -> Iterator[tuple[str, str]]:
        """(split, text) as the stream is read: a dataset's own validation split after its train
        split, or one split divided by the hash of each document's name."""
        loaded, wanted = self._opened()
        if len(wanted) == 2:
            return ((ours, text) for ours, theirs in wanted.items() for text, _ in self._rows(loaded[theirs], theirs))
        return (("validation" if self.in_validation(source) else "train", text)
                for text, source in self._rows(loaded[wanted["train"]], "train"))

    def fingerprint(self) -> str:
        local = None
        if self.data_files:
            local = {k: [(f, Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in fs]
                     for k, fs in self.data_files.items()}
        if self.disk is not None:  # every file save_to_disk wrote: a new save is a new corpus
            local = sorted((str(p.relative_to(self.disk)), p.stat().st_size, p.stat().st_mtime_ns)
                           for p in self.disk.rglob("*") if p.is_file())
            local = {"disk": [str(self.disk.resolve()), local]}
        return (f"hub:{self.path}:{self.config}:{self.revision}:{self.text_column}:{sorted(self.splits.items())}:"
                f"{self.max_tokens}:{self.max_documents}:{self.val_fraction}:{local}")
