"""Per-position loss: the loss against the position inside the window, bucketed."""

import json
import math

import numpy as np
import torch
from torch import nn

from posenc.data.batches import IGNORE_INDEX, Batch
from posenc.eval.per_position import as_table_rows, bucket, corpus_batches, per_position, write_per_position
from posenc.nn.encodings.learned import Learned
from posenc.nn.model import GPT


class Constant(nn.Module):
    """The same logits everywhere: a uniform prediction over the vocabulary."""

    def forward(self, x):
        return torch.zeros(*x.shape, 256), None


class KnowsOnlyFirstHalf(nn.Module):
    """Predicts the next token exactly in the first `cut` positions, uniformly after."""

    def __init__(self, cut: int) -> None:
        super().__init__()
        self.cut = cut

    def forward(self, x):
        logits = torch.zeros(*x.shape, 256)
        logits[:, : self.cut] = 100.0 * torch.nn.functional.one_hot((x[:, : self.cut] + 1) % 256, 256)
        return logits, None


def test_a_constant_model_has_a_flat_curve_at_log_v():
    tokens = np.random.default_rng(0).integers(0, 256, 4097)
    record = per_position(Constant(), {L: corpus_batches(tokens, L, 1024) for L in (32, 256)}, train_length=32)
    assert [r["length"] for r in record["lengths"]] == [32, 256]
    short, long = record["lengths"]
    assert len(short["loss"]) == 32 and len(long["loss"]) == 64  # one bucket per position, at most 64
    assert long["start"][0] == 0 and long["end"][-1] == 256 and sum(long["count"]) == 1024
    for r in record["lengths"]:
        assert all(math.isclose(v, math.log(256), rel_tol=1e-6) for v in r["loss"])


def test_the_curve_shows_where_a_model_breaks():
    tokens = np.arange(4097) % 256  # the next token is always x + 1
    record = per_position(KnowsOnlyFirstHalf(cut=32), {64: corpus_batches(tokens, 64, 4096)}, train_length=32)
    loss = record["lengths"][0]["loss"]
    assert max(loss[:32]) < 1e-6 and min(loss[32:]) > math.log(256) - 1e-3


def test_a_learned_table_has_no_curve_beyond_max_len():
    model = GPT(256, Learned(32, 4, max_len=64), n_layer=1, n_head=4, d_model=32)
    tokens = np.random.default_rng(0).integers(0, 256, 1025)
    record = per_position(model, {L: corpus_batches(tokens, L, 512) for L in (64, 128)}, train_length=64)
    defined, beyond = record["lengths"]
    assert len(defined["loss"]) == 64 and beyond["loss"] is None and "63" in beyond["skipped"]
    assert {row[0] for row in as_table_rows(record)} == {64}


def test_buckets_without_targets_are_null_and_means_are_weighted_by_count():
    out = bucket(np.array([1.0, 3.0, 0.0, 0.0]), np.array([1, 1, 0, 0]), buckets=2)
    assert out["loss"] == [2.0, None] and out["count"] == [2, 0]
    x = torch.zeros(1, 4, dtype=torch.int64)
    y = torch.tensor([[1, IGNORE_INDEX, IGNORE_INDEX, 1]])
    record = per_position(Constant(), {4: [Batch(x, y)]}, train_length=4, buckets=4)
    assert record["lengths"][0]["loss"][1:3] == [None, None]


def test_written_as_json_and_png(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 256, 1025)
    record = per_position(Constant(), {16: corpus_batches(tokens, 16, 512)}, train_length=16)
    json_path, png_path = write_per_position(record, tmp_path)
    assert json.loads(json_path.read_text()) == record
    assert png_path.read_bytes()[:4] == b"\x89PNG"


def test_the_figure_gives_the_positions_up_to_the_training_length_room(tmp_path, monkeypatch):
    """At 16x the training length a linear axis puts every position the model was trained on in
    the first 1/16 of the plot; on the log-2 axis each doubling is as wide, and the training
    length is ticked and drawn."""
    import posenc.eval.per_position as module

    kept = []
    monkeypatch.setattr(module, "save_figure", lambda fig, path: kept.append(fig) or path)
    tokens = np.random.default_rng(0).integers(0, 256, 1025)
    record = per_position(Constant(), {L: corpus_batches(tokens, L, 512) for L in (16, 256)}, train_length=16)
    write_per_position(record, tmp_path)
    [ax] = kept[0].axes
    to_pixels = ax.transData.transform
    assert to_pixels((16, 0))[0] - to_pixels((0, 0))[0] >= 0.3 * ax.get_window_extent().width
    assert "16" in [t.get_text() for t in ax.get_xticklabels()]
    assert any(list(line.get_xdata()) == [16, 16] for line in ax.get_lines())  # the dashed training length
    legend_texts = [t.get_text() for legend in kept[0].legends for t in legend.get_texts()]
    assert legend_texts[:2] == ["16 (1×)", "256 (16×)"]  # shortest first, as a reader counts
