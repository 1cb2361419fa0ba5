"""Local corpora: documents as a ``datasets.Dataset`` (columns text, source), split
deterministically by document into train and validation. Hub corpora: hub_corpora.py."""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import zlib
from pathlib import Path

from posenc.errors import UserError

log = logging.getLogger("posenc")

SPLITS = ("train", "validation")
#: how windows are cut from the packed documents (posenc/data/windows.py)
PACKINGS = ("concat", "bos_aligned", "documents")


class Corpus:
    """A source of documents. ``documents`` returns a Dataset with columns text, source.

    ``packing`` says how training and evaluation windows are cut from them (posenc/data/windows.py):
    concat (anywhere in one long concatenation), bos_aligned (starting at a document start) or
    documents (anywhere, but no token attends across a document and positions restart in each)."""

    name: str = "corpus"

    def __init__(self, name: str, val_fraction: float = 0.05, packing: str = "concat") -> None:
        if not 0.0 < val_fraction < 1.0:
            raise UserError(f"dataset.val_fraction must be in (0, 1), got {val_fraction}")
        if packing not in PACKINGS:
            raise UserError(f"dataset.packing must be one of {', '.join(PACKINGS)}, got '{packing}'")
        self.name = name
        self.val_fraction = float(val_fraction)
        self.packing = packing

    def documents(self):  # -> datasets.Dataset | datasets.DatasetDict
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def in_validation(self, source: str) -> bool:
        """Whether the document named ``source`` is a validation document: a stable hash of its
        name, so the split is the same on every machine and in every read of the corpus (a stream's too)."""
        return zlib.crc32(source.encode()) % 10_000 < int(self.val_fraction * 10_000)

    #: whether the corpus is read as a stream (stream_documents), too large to hold, rather than
    #: whole (documents)
    streams: bool = False

    def stream_documents(self):  # -> Iterator[tuple[str, str]]
        """(split, text) of every document as it is read, for a corpus too large to hold
        (posenc.data.packing tokenizes it as it streams)."""
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
        is_val = [self.in_validation(s) for s in docs["source"]]
        if all(is_val) or not any(is_val):  # few documents: fall back to the last one(s), and say so
            n_val = max(1, round(self.val_fraction * len(docs)))
            is_val = [i >= len(docs) - n_val for i in range(len(docs))]
            log.warning("dataset '%s' has only %d documents, too few to pick val_fraction=%g of them by hash: "
                        "validation is its last %d document(s), %.0f%% of the text — add text for a %g split",
                        self.name, len(docs), self.val_fraction, n_val,
                        100 * sum(len(t) for t in docs["text"][-n_val:]) / max(1, sum(len(t) for t in docs["text"])),
                        self.val_fraction)
        val_idx = [i for i, v in enumerate(is_val) if v]
        train_idx = [i for i, v in enumerate(is_val) if not v]
        return datasets.DatasetDict(train=docs.select(train_idx), validation=docs.select(val_idx))


def _is_test_path(parts: tuple[str, ...]) -> bool:
    return any(p in ("test", "tests", "idle_test") for p in parts)


class PyStdlib(Corpus):
    """The running interpreter's standard library source (tests excluded) plus pydoc topics:
    ~11 MB of real text that every machine has, no network."""

    def __init__(self, name: str = "pystdlib", val_fraction: float = 0.05, packing: str = "concat") -> None:
        super().__init__(name, val_fraction, packing)
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


def text_files(files: list[str]) -> list[Path]:
    """dataset.files as paths, each checked to be a readable file: `posenc train` asks before it
    makes a run directory (cli/hydra_commands.check_run), the corpus again when it is built."""
    if not files:
        raise UserError("dataset=text needs files: dataset.files=[path/a.txt,path/b.txt]")
    paths = [Path(os.path.expanduser(str(f))) for f in files]
    for p in paths:
        if not p.is_file():
            raise UserError(f"dataset.files: '{p}' does not exist or is not a file — check the path")
        if not os.access(p, os.R_OK):
            raise UserError(f"dataset.files: '{p}' is not readable — check its permissions")
    return paths


class TextFiles(Corpus):
    """The user's own text files. Each file is cut into blocks of ``lines_per_doc`` lines so
    that even a single file splits into train and validation by block."""

    def __init__(
        self, files: list[str], name: str = "text", val_fraction: float = 0.05, lines_per_doc: int = 200,
        packing: str = "concat",
    ) -> None:
        super().__init__(name, val_fraction, packing)
        self.paths = text_files(files)
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
        # the path as given too: the split hashes each document's source, which holds it
        stats = [(str(p), str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in self.paths]
        return f"text:{stats}:{self.val_fraction}:{self.lines_per_doc}"


