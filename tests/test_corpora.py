"""The Hub corpora's real loading code on local files (no Hub), and the BPE tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

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
