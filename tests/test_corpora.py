"""The Hub corpora's real loading code on local files (no Hub), and the BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, run_cli, run_dirs

from posenc.data.hub_corpora import HubCorpus
from posenc.data.packing import load_tokens
from posenc.errors import UserError
from posenc.data.tokenizers import BPETokenizer, ByteTokenizer

STORY = "Once upon a time a small robot learned to count the stars in the sky. "


def write_parquet(path: Path, texts: list[str]) -> str:
    import datasets

    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(path))
    return str(path)


def test_published_splits_pack_and_count_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    train = write_parquet(tmp_path / "train.parquet", [STORY * 3, "", STORY])  # blank rows are dropped
    val = write_parquet(tmp_path / "val.parquet", [STORY])
    corpus = HubCorpus("tinystories", path="roneneldan/TinyStories", splits={"train": "train", "validation": "validation"},
                       data_files={"train": [train], "validation": [val]})
    data = load_tokens(corpus, ByteTokenizer(), log=lambda *_: None)
    assert len(data.train) == len((STORY * 4).encode()) and data.meta["documents"]["train"] == 2
    assert data.bytes_per_token("validation") == 1.0  # bytes: bpb = loss / ln 2


def test_streamed_corpus_stops_at_max_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    files = [write_parquet(tmp_path / "web.parquet", [f"{i}: {STORY}" for i in range(200)])]
    corpus = HubCorpus("fineweb_edu", path="HuggingFaceFW/fineweb-edu", streaming=True, max_tokens=2_000,
                       data_files=files, val_fraction=0.2)
    data = load_tokens(corpus, ByteTokenizer(), log=lambda *_: None)
    total = sum(data.meta["bytes"].values())
    assert 2_000 <= total < 2_000 + len(STORY) + 10  # read up to the cap, not the whole file


def test_bpe_is_trained_cached_and_keeps_bpb_per_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    train = write_parquet(tmp_path / "t.parquet", [STORY * 20] * 5)
    corpus = HubCorpus("tinystories", path="x", splits={"train": "train", "validation": "validation"},
                       data_files={"train": [train], "validation": [train]})
    data = load_tokens(corpus, BPETokenizer(vocab_size=300, min_frequency=1), log=lambda *_: None)
    assert (data.path / "tokenizer.json").exists()
    assert data.bytes_per_token("validation") > 1.0  # merges: more than one byte per token
    again = BPETokenizer(vocab_size=300, min_frequency=1)
    load_tokens(corpus, again, log=lambda *_: None)  # the cache, with the saved tokenizer
    assert again.decode(again.encode_batch([STORY])[0]) == STORY


def test_hub_corpus_offline_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        HubCorpus("wikitext2", path="Salesforce/wikitext", config="wikitext-2-raw-v1").documents()


def write_jsonl(path: Path, texts: list[str]) -> str:
    path.write_text("".join(json.dumps({"id": f"doc{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return str(path)


def test_a_streamed_corpus_packs_as_the_same_corpus_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """streaming=true tokenizes as it reads, never holding the corpus, and packs the very files
    that reading it whole does: the same documents on each side of the same hash split (the
    validation split stays fixed), the same BPE learned from the train split, the same counts."""
    texts = [f"{i}: {STORY * (1 + i % 3)}" for i in range(120)]
    files = [write_jsonl(tmp_path / "corpus.jsonl", texts)]
    packed = {}
    for streaming in (False, True):
        monkeypatch.setenv("POSENC_CACHE", str(tmp_path / f"cache-{streaming}"))
        corpus = HubCorpus("hf", data_files=files, streaming=streaming, val_fraction=0.2)
        packed[streaming] = load_tokens(corpus, BPETokenizer(vocab_size=300, min_frequency=1), log=lambda *_: None)
    whole, streamed = packed[False], packed[True]
    assert whole.meta == streamed.meta and 0 < whole.meta["documents"]["validation"] < 120
    for split in ("train", "validation"):
        assert np.array_equal(getattr(whole, split), getattr(streamed, split)), split
        assert np.array_equal(whole.starts[split], streamed.starts[split]), split
    assert streamed.counts()["tokens"] == {"train": len(streamed.train), "validation": len(streamed.validation)}


def test_a_lab_corpus_without_a_source_or_its_text_column_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="dataset.data_files=.*dataset.load_from_disk"):
        HubCorpus("hf")
    with pytest.raises(UserError, match="not a folder `datasets` save_to_disk wrote"):
        HubCorpus("hf", load_from_disk=str(tmp_path))
    with pytest.raises(UserError, match="cannot read files with suffix"):
        HubCorpus("hf", data_files=[write_jsonl(tmp_path / "a.jsonl", [STORY]), write_parquet(tmp_path / "b.parquet", [STORY])])
    corpus = HubCorpus("hf", data_files=[write_jsonl(tmp_path / "c.jsonl", [STORY])], text_column="body")
    with pytest.raises(UserError, match="has no column 'body' \\(it has id, text\\) — set dataset.text_column"):
        corpus.documents()


@pytest.mark.parametrize("source", ["jsonl, streamed", "save_to_disk folder"])
def test_a_lab_corpus_trains(source: str, tmp_path: Path) -> None:
    """dataset=hf on a lab's own data: a jsonl file read as a stream, and a folder `datasets`'
    save_to_disk wrote (its own train and validation splits, a `content` column), each trains,
    and the summary says how many tokens and documents the corpus gave each split."""
    import datasets

    texts = [f"{i}: {STORY * 2}" for i in range(100)]
    if source.startswith("jsonl"):
        args = [f"dataset.data_files=[{write_jsonl(tmp_path / 'corpus.jsonl', texts)}]", "dataset.streaming=true",
                "dataset.val_fraction=0.2"]
    else:
        datasets.DatasetDict(train=datasets.Dataset.from_dict({"content": texts[:80]}),
                             validation=datasets.Dataset.from_dict({"content": texts[80:]})).save_to_disk(
            str(tmp_path / "corpus"))
        args = [f"dataset.load_from_disk={tmp_path / 'corpus'}", "dataset.text_column=content"]
    result = run_cli("train", *TINY, "dataset=hf", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    corpus = summary["corpus"]
    assert corpus["name"] == "hf" and sum(corpus["documents"].values()) == 100
    assert sum(corpus["bytes"].values()) == sum(len(t.encode()) for t in texts)
    assert corpus["tokens"]["validation"] > 0 and summary["status"] == "completed"
    if not source.startswith("jsonl"):
        assert corpus["documents"] == {"train": 80, "validation": 20}  # the folder's own splits
