"""The data pipeline: pystdlib through `datasets`, the split, the cache, the windows."""

import numpy as np
import pytest

from posenc.data.corpora import PyStdlib, TextFiles

from posenc.data.windows import RandomWindows
from posenc.eval.loss import fixed_span, sliding_windows

from posenc.data.packing import load_tokens
from posenc.errors import UserError
from posenc.data.tokenizers import ByteTokenizer


def test_pystdlib_excludes_tests_and_splits_deterministically_by_file():
    corpus = PyStdlib()
    files = corpus.files()
    assert len(files) > 300
    assert not any("test" in f.relative_to(corpus.root).parts[:-1] for f in files)
    docs = corpus.documents()
    a, b = corpus.split(docs), corpus.split(docs)
    assert a["validation"]["source"] == b["validation"]["source"]
    assert set(a["train"]["source"]).isdisjoint(a["validation"]["source"])
    assert 0.01 < len(a["validation"]) / len(docs) < 0.15
    assert any(s.startswith("pydoc_topics/") for s in docs["source"])


def test_packed_arrays_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    f = tmp_path / "corpus.txt"
    f.write_text("".join(f"line {i} of some text\n" for i in range(2000)))
    corpus = TextFiles(files=[str(f)])
    messages = []
    data = load_tokens(corpus, ByteTokenizer(), log=messages.append)
    assert len(messages) == 1  # built once
    again = load_tokens(corpus, ByteTokenizer(), log=messages.append)
    assert len(messages) == 1  # the second load reads the cache, no re-tokenizing
    assert np.array_equal(data.train, again.train)
    total = data.meta["tokens"]["train"] + data.meta["tokens"]["validation"]
    assert total == len(f.read_bytes())  # byte-level: every byte once, nothing lost
    assert "of some text\nline" in ByteTokenizer().decode(data.train[:200])


def test_text_corpus_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        TextFiles(files=[str(tmp_path / "missing.txt")])
    with pytest.raises(UserError, match="needs files"):
        TextFiles(files=[])


def test_random_windows_are_reproducible_and_resumable():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = RandomWindows(tokens, seq_len=16, batch_size=4, seed=3)
    b = RandomWindows(tokens, seq_len=16, batch_size=4, seed=3)
    first = a.next()
    x, y = first.x, first.y
    assert x.shape == (4, 16) and np.array_equal(y[:, :-1], x[:, 1:])  # targets are inputs shifted
    assert np.array_equal(x, b.next().x)
    state = a.state_dict()
    expected = a.next().x
    a.load_state_dict(state)
    assert np.array_equal(a.next().x, expected)


def test_eval_windows_are_fixed_and_non_overlapping():
    """Every run scores the same validation targets: windows at 0, L, 2L, ... (each reads L+1 tokens)."""
    span = fixed_span(1000, 100)
    assert [start for start, _ in sliding_windows(span, 100, None)] == [0, 100, 200, 300, 400, 500, 600, 700, 800]
    assert [start for start, _ in sliding_windows(fixed_span(1000, 100, 3), 100, None)] == [0, 100, 200]


def test_a_corpus_shorter_than_one_window_is_refused():
    with pytest.raises(UserError, match="fewer than one window"):
        RandomWindows(np.zeros(10, dtype=np.uint16), seq_len=16, batch_size=1, seed=0)
