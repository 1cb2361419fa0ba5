"""dataset.packing: document starts in the packed cache, and windows cut by document.

Properties: the cache records where every document starts (for the byte tokenizer too, with its
separator token ending each document); concat and documents draw the same windows from the same
seed; under documents every document's first token has position 0 and ids change exactly at
document starts; bos_aligned windows start at a document; evaluation under documents scores the
same targets as concat; a resumed documents run draws the same batches; a whole run trains and
reports which packing it used, with the per-position loss against the position in the document.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import TINY, run_cli, run_dirs
from posenc.data.windows import RandomWindows
from posenc.data.corpora import TextFiles
from posenc.data.packing import load_tokens
from posenc.data.tokenizers import ByteTokenizer
from posenc.data.windows import Packing
from posenc.eval.loss import score_windows
from posenc.nn.model import GPT
from posenc.nn.encodings.rope import RoPE

LINES_PER_DOC = 3


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A text whose documents (blocks of 3 lines) have known, varied lengths."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "corpus.txt"
    f.write_text("".join(f"line {i} {'x' * (i % 17)}\n" for i in range(3000)))
    return TextFiles(files=[str(f)], lines_per_doc=LINES_PER_DOC)


def documents_of(corpus: TextFiles, split: str) -> list[bytes]:
    docs = corpus.split(corpus.documents())[split]
    return [t.encode() for t in docs["text"]]


@pytest.mark.parametrize("separator", [False, True])
def test_the_cache_records_where_every_document_starts(corpus, separator):
    data = load_tokens(corpus, ByteTokenizer(separator=separator), log=lambda m: None)
    for split, tokens in (("train", data.train), ("validation", data.validation)):
        docs = documents_of(corpus, split)
        lengths = [len(d) + separator for d in docs]
        assert data.starts[split].tolist() == np.cumsum([0, *lengths[:-1]]).tolist()
        first, second = data.starts[split][:2]
        assert np.asarray(tokens[first : first + len(docs[0])], dtype=np.uint8).tobytes() == docs[0]
        if separator:  # every document ends with the separator, id 256 (vocab 257)
            assert data.vocab_size == 257 and tokens[second - 1] == 256
            assert (np.asarray(tokens)[data.starts[split][1:] - 1] == 256).all()
        else:
            assert data.vocab_size == 256 and int(np.asarray(tokens).max()) < 256


def test_concat_and_documents_draw_the_same_windows_and_documents_marks_them(corpus):
    data = load_tokens(corpus, ByteTokenizer(separator=True), log=lambda m: None)
    concat = RandomWindows(data.train, 64, 8, seed=5)
    docs = RandomWindows(data.train, 64, 8, seed=5, packing=Packing("documents", data.starts["train"]))
    a, b = concat.next(), docs.next()
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.doc is None and a.pos is None
    starts = set(data.starts["train"].tolist())
    # recover each window's offset from its tokens, then check ids and positions token by token
    for row in range(8):
        offset = next(o for o in range(len(data.train) - 64) if np.array_equal(data.train[o : o + 64], b.x[row].numpy()))
        for t in range(64):
            begins = (offset + t) in starts
            assert (b.pos[row, t] == 0) == (begins or t == 0)
            if t:
                assert (b.doc[row, t] == b.doc[row, t - 1] + 1) == begins and b.doc[row, t] >= b.doc[row, t - 1]
        assert b.length == int(b.pos.max()) + 1


def test_bos_aligned_windows_start_at_a_document(corpus):
    data = load_tokens(corpus, ByteTokenizer(separator=True), log=lambda m: None)
    aligned = RandomWindows(data.train, 64, 16, seed=0, packing=Packing("bos_aligned", data.starts["train"]))
    batch = aligned.next()
    heads = {np.asarray(data.train[s : s + 8], dtype=np.uint8).tobytes() for s in data.starts["train"].tolist()}
    assert all(bytes(row[:8].numpy().astype(np.uint8)) in heads for row in batch.x)
    assert batch.doc is None  # positions 0..T-1 and causal attention across the next documents


def test_a_resumed_documents_run_draws_the_same_batches(corpus):
    data = load_tokens(corpus, ByteTokenizer(), log=lambda m: None)
    windows = RandomWindows(data.train, 32, 4, seed=1, packing=Packing("documents", data.starts["train"]))
    windows.next()
    state = windows.state_dict()
    expected = windows.next()
    windows.load_state_dict(state)
    again = windows.next()
    assert all(torch.equal(getattr(again, k), getattr(expected, k)) for k in ("x", "y", "pos", "doc"))


def test_documents_evaluation_scores_the_same_targets_as_concat_and_bos_aligned_starts_at_documents(corpus):
    data = load_tokens(corpus, ByteTokenizer(separator=True), log=lambda m: None)
    torch.manual_seed(0)
    model = GPT(257, RoPE(32, 2), n_layer=1, n_head=2, d_model=32)
    scored = {}
    for packing in ("concat", "documents"):
        scored[packing] = score_windows(model, data.validation_windows(packing), 64, 1024, batch_size=4,
                                        device=torch.device("cpu"))
    assert scored["concat"].scored_tokens == scored["documents"].scored_tokens == 1024
    assert scored["concat"].loss != scored["documents"].loss  # the mask changes what the model sees
    aligned = data.validation_windows("bos_aligned")
    starts = aligned.starts(1024, 64, None)
    assert starts and {s for s, _ in starts} <= set(data.starts["validation"].tolist())
    assert all(b - a >= 64 for (a, _), (b, _) in zip(starts, starts[1:]))  # never overlapping


def test_an_unknown_packing_is_refused_in_one_line(workdir):
    result = run_cli("train", *TINY, "dataset.packing=padded", cwd=workdir)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == ("error: dataset.packing=padded is out of range: it must be one "
                                                      "of concat, bos_aligned, documents — use e.g. "
                                                      "dataset.packing=documents")
    assert not (workdir / "outputs").exists() or not run_dirs(workdir)


def test_a_documents_run_trains_evaluates_and_says_how_its_windows_were_cut(workdir):
    result = run_cli("train", *TINY, "dataset.packing=documents", "tokenizer.separator=true", "eval.at_end=true",
                     "eval.lengths=[1,2]", "eval.tokens=256", cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run,) = run_dirs(workdir)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["packing"] == "documents" and summary["extrapolation"]["packing"] == "documents"
    assert summary["extrapolation/ppl@64"] is not None
    record = json.loads((run / "per_position.json").read_text())
    assert all(r["document"]["count"] for r in record["lengths"])  # loss against the position in the document


#: train/loss at steps 1-4 and val/loss at steps 2 and 4 of the run below, recorded with posenc
#: before packing existed (main at 9e2e784, torch 2.13 CPU)
BEFORE_PACKING = {
    "rope": ([5.8068037033081055, 5.602056980133057, 5.391871929168701, 5.251156330108643],
             [5.426623106002808, 5.236849546432495]),
    "alibi": ([5.810440540313721, 5.6089887619018555, 5.396968364715576, 5.251157760620117],
              [5.42236590385437, 5.232698917388916]),
}


@pytest.mark.parametrize("name", sorted(BEFORE_PACKING))
def test_concat_reproduces_the_losses_of_posenc_before_packing(name, workdir):
    """The default packing changes nothing: the same windows, the same causal kernel, the same
    losses (bit for bit on the machine they were recorded on; 1e-6 allows another CPU's BLAS)."""
    text = workdir / "corpus.txt"
    text.write_text("".join(f"def f{i}(x):\n    return x * {i % 13} + {i % 7}  # line {i}\n" for i in range(3000)))
    # a relative path: the split hashes each document's source, which holds the path as given
    result = run_cli("train", *TINY, f"encoding={name}", "dataset=text", "dataset.files=[corpus.txt]", cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run,) = run_dirs(workdir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train, val = BEFORE_PACKING[name]
    assert [r["train/loss"] for r in rows] == pytest.approx(train, rel=1e-6)
    assert [r["val/loss"] for r in rows if "val/loss" in r] == pytest.approx(val, rel=1e-6)
