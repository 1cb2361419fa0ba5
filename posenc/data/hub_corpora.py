"""Corpora from the Hugging Face Hub through ``datasets``: wikitext, TinyStories, FineWeb-Edu.

They feed the same packing and cache as the local corpora (posenc.data): ``documents``
returns a DatasetDict (train, validation) when the dataset ships both splits, else one
Dataset that ``Corpus.split`` divides deterministically. ``data_files`` points the same
code at local parquet/text/json files (a mirror, or a test fixture) instead of the Hub.
"""

from __future__ import annotations

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


class HubCorpus(Corpus):
    """A Hub dataset (``path``, ``config``) with a text column.

    Args:
        path, config, revision: what ``datasets.load_dataset`` fetches.
        text_column: the column holding the text.
        splits: our split name -> the dataset's (e.g. validation: validation); a dataset with
            only a train split is split by document hash instead.
        streaming: read the dataset as a stream (FineWeb-Edu: nothing is downloaded whole).
        max_tokens: stop reading after this many UTF-8 bytes of text (= byte-level tokens),
            counted before tokenization so the cap does not depend on the tokenizer.
        max_documents: stop after this many documents per split.
        data_files: local files instead of the Hub: a list, or {train: [...], validation: [...]}.
    """

    def __init__(self, name: str, path: str, config: str | None = None, revision: str | None = None,
                 text_column: str = "text", splits: dict | None = None, streaming: bool = False,
                 max_tokens: int | None = None, max_documents: int | None = None,
                 data_files=None, val_fraction: float = 0.05, packing: str = "concat") -> None:
        super().__init__(name, val_fraction, packing)
        self.path, self.config, self.revision = path, config, revision
        self.text_column = text_column
        self.splits = dict(splits or {})
        self.streaming = bool(streaming)
        self.max_tokens = int(max_tokens) if max_tokens else None
        self.max_documents = int(max_documents) if max_documents else None
        self.data_files = self._local_files(data_files)

    def _local_files(self, data_files) -> dict[str, list[str]] | None:
        if not data_files:
            return None
        files = dict(data_files) if hasattr(data_files, "items") else {"train": list(data_files)}
        files = {k: [str(Path(f).expanduser()) for f in ([v] if isinstance(v, str) else v)] for k, v in files.items()}
        for f in (f for fs in files.values() for f in fs):
            if not Path(f).is_file():
                raise UserError(f"dataset.data_files: '{f}' does not exist — check the path")
        return files

    # --- loading ----------------------------------------------------------------------
    def _load(self):
        import datasets

        if self.data_files is not None:  # local mirror: the same code, no network
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

    def _take(self, rows, split: str):
        """Up to max_documents non-empty texts / max_tokens bytes, as a Dataset(text, source)."""
        import datasets

        texts, sources, n_bytes = [], [], 0
        for i, row in enumerate(rows):
            text = row[self.text_column]
            if not text or not text.strip():
                continue  # wikitext's blank lines carry no text
            texts.append(text)
            sources.append(f"{split}/{row.get('id', i)}")
            n_bytes += len(text.encode("utf-8"))
            if (self.max_documents and len(texts) >= self.max_documents) or (self.max_tokens and n_bytes >= self.max_tokens):
                break
        return datasets.Dataset.from_dict({"text": texts, "source": sources})

    def documents(self):
        import datasets

        loaded = self._load()
        if self.text_column not in (loaded[next(iter(loaded))].column_names or [self.text_column]):
            raise UserError(f"dataset '{self.name}' has no column '{self.text_column}' — set dataset.text_column")
        wanted = {ours: theirs for ours, theirs in self.splits.items() if theirs in loaded}
        if set(wanted) == set(SPLITS):
            return datasets.DatasetDict({ours: self._take(loaded[theirs], theirs) for ours, theirs in wanted.items()})
        return self._take(loaded[self.splits.get("train", "train")], "train")

    def fingerprint(self) -> str:
        local = None
        if self.data_files:
            local = {k: [(f, Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in fs]
                     for k, fs in self.data_files.items()}
        return (f"hub:{self.path}:{self.config}:{self.revision}:{self.text_column}:{sorted(self.splits.items())}:"
                f"{self.max_tokens}:{self.max_documents}:{self.val_fraction}:{local}")
