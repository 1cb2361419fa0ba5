"""Per-position loss: the loss against the position inside the window, on position bins every
evaluation length shares, with the spread across windows."""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from posenc.data.batches import IGNORE_INDEX, Batch
from posenc.eval.per_position import as_table_rows, corpus_batches, per_position, write_per_position
from posenc.eval.position_bins import BinStats, position_bins
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


def pooled(curve: dict, lo: int, hi: int) -> float:
    """The mean loss over the bins that lie within positions [lo, hi), weighted by their targets."""
    inside = [(v, c) for s, e, v, c in zip(curve["start"], curve["end"], curve["loss"], curve["count"])
              if s >= lo and e <= hi and v is not None]
    return sum(v * c for v, c in inside) / sum(c for _, c in inside)


def test_a_constant_model_has_a_flat_curve_at_log_v_on_bins_every_length_shares():
    tokens = np.random.default_rng(0).integers(0, 256, 4097)
    record = per_position(Constant(), {L: corpus_batches(tokens, L, 1024) for L in (32, 256)}, train_length=32)
    assert [r["length"] for r in record["lengths"]] == [32, 256]
    short, long = record["lengths"]
    assert long["start"][0] == 0 and long["end"][-1] == 256 and sum(long["count"]) == 1024
    # the same bins at both lengths: a bin means the same positions at 1× and at 8×
    assert long["start"][: len(short["start"])] == short["start"] and long["end"][: len(short["end"])] == short["end"]
    assert short["end"][-1] == 32 and short["start"][:5] == [0, 1, 2, 3, 4]  # single positions where loss moves fastest
    widths = np.diff(record["edges"])[4:] / np.array(record["edges"][4:-1])
    assert widths.max() <= 0.5 and widths[-4:] == pytest.approx(2**0.5 - 1, abs=0.01)  # 2 bins per doubling
    for r in record["lengths"]:
        assert all(math.isclose(v, math.log(256), rel_tol=1e-6) for v in r["loss"])


def test_the_bins_are_log_spaced_and_every_length_is_an_edge():
    edges = position_bins(4096, [256, 1024, 4096, 384])
    assert list(edges[:6]) == [0, 1, 2, 3, 4, 6] and edges[-1] == 4096
    assert {256, 384, 1024} <= set(edges.tolist())
    assert len(edges) < 30  # 2 per doubling: a few dozen points at 16×, not 4,096


def test_the_curve_shows_where_a_model_breaks():
    tokens = np.arange(4097) % 256  # the next token is always x + 1
    record = per_position(KnowsOnlyFirstHalf(cut=32), {64: corpus_batches(tokens, 64, 4096)}, train_length=32)
    curve = record["lengths"][0]
    assert pooled(curve, 0, 32) < 1e-6 and pooled(curve, 32, 64) > math.log(256) - 1e-3
    assert 32 in curve["start"]  # the break falls on a bin edge: no bin mixes both sides of it


def test_a_learned_table_has_no_curve_beyond_max_len():
    model = GPT(256, Learned(32, 4, max_len=64), n_layer=1, n_head=4, d_model=32)
    tokens = np.random.default_rng(0).integers(0, 256, 1025)
    record = per_position(model, {L: corpus_batches(tokens, L, 512) for L in (64, 128)}, train_length=64)
    defined, beyond = record["lengths"]
    assert defined["end"][-1] == 64 and beyond["loss"] is None and "63" in beyond["skipped"]
    assert {row[0] for row in as_table_rows(record)} == {64}


def test_bins_without_targets_are_null_and_means_are_weighted_by_count():
    x = torch.zeros(1, 4, dtype=torch.int64)
    y = torch.tensor([[1, IGNORE_INDEX, IGNORE_INDEX, 1]])
    record = per_position(Constant(), {4: [Batch(x, y)]}, train_length=4)
    assert record["lengths"][0]["loss"][1:3] == [None, None] and record["lengths"][0]["count"] == [1, 0, 0, 1]
    stats = BinStats(np.array([0, 2, 4]))
    stats.add(np.array([[1.0, 3.0, 0.0, 0.0]]), np.array([[True, True, False, False]]), np.arange(4)[None])
    stats.add(np.array([[5.0, 0.0, 0.0, 0.0]]), np.array([[True, False, False, False]]), np.arange(4)[None])
    curve = stats.curve(4)
    assert curve["loss"] == [3.0, None] and curve["count"] == [3, 0]  # (1 + 3 + 5) / 3 targets, not (2 + 5) / 2


def test_the_band_is_the_t_interval_of_the_windows_own_means():
    """The band says how far the windows' losses in a bin spread: the 95% t-interval of the mean of
    each window's mean there (scipy.stats), None where one window alone has a target."""
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(0)
    loss = rng.gamma(2.0, 0.7, size=(6, 8))  # 6 windows of 8 positions
    bins = BinStats(np.array([0, 1, 2, 4, 8]))
    bins.add(loss[:4], np.ones((4, 8), bool), np.broadcast_to(np.arange(8), (4, 8)))  # two batches, as a run feeds it
    bins.add(loss[4:], np.ones((2, 8), bool), np.broadcast_to(np.arange(8), (2, 8)))
    curve = bins.curve(8)
    for i, (start, end) in enumerate(zip(curve["start"], curve["end"])):
        means = loss[:, start:end].mean(axis=1)
        low, high = scipy_stats.t.interval(0.95, len(means) - 1, loc=means.mean(), scale=scipy_stats.sem(means))
        assert curve["low"][i] == pytest.approx(max(0.0, low), rel=1e-9) and curve["high"][i] == pytest.approx(high, rel=1e-9)
    one = BinStats(np.array([0, 8]))
    one.add(loss[:1], np.ones((1, 8), bool), np.arange(8)[None])
    assert one.curve(8)["low"] == [None]


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
    assert legend_texts[:2] == ["16 (1×, 32 windows)", "256 (16×, 2 windows)"]  # shortest first, as a reader counts
    assert "band: 95% interval" in kept[0].legends[0].get_title().get_text()


class NextIsPlusOne(nn.Module):
    """Predicts x + 1 with certainty: loss 0 where the text counts up, ~100 nats elsewhere."""

    def forward(self, x):
        return 100.0 * torch.nn.functional.one_hot((x + 1) % 256, 256).float(), None


def test_a_stride_places_overlapping_windows_and_changes_the_curve_where_the_text_changes():
    """eval.stride=64 once gave per-position files identical to the non-overlapping ones.
    The text counts up for its first 64 tokens, then is random: non-overlapping windows of 64
    see one of each at every position (a flat curve); windows every 32 tokens also see the one
    starting at 32, whose first half counts up and second half does not."""
    rng = np.random.default_rng(0)
    tokens = np.concatenate([np.arange(64), rng.integers(0, 256, 65)])  # 129 tokens: 128 targets
    flat = per_position(NextIsPlusOne(), {64: corpus_batches(tokens, 64, 128)}, train_length=64)
    strided = per_position(NextIsPlusOne(), {64: corpus_batches(tokens, 64, 128, stride=32)}, train_length=64)
    (f,), (s,) = flat["lengths"], strided["lengths"]
    assert (f["windows"], s["windows"], flat["stride"], strided["stride"]) == (2, 3, None, 32)
    assert sum(f["count"]) == 128 and sum(s["count"]) == 192  # every position of every window scored
    assert pooled(f, 0, 32) == pytest.approx(50, abs=2) == pooled(f, 32, 64)  # 1 of 2 windows right at every position
    assert pooled(s, 0, 32) == pytest.approx(100 / 3, abs=2) and pooled(s, 32, 64) == pytest.approx(200 / 3, abs=2)
    same = per_position(NextIsPlusOne(), {64: corpus_batches(tokens, 64, 128, stride=64)}, train_length=64)
    assert same["lengths"][0]["loss"] == f["loss"]  # a stride of a whole window is the non-overlapping cut


def test_each_length_prints_its_start_its_progress_and_its_result():
    from rich.console import Console
    import io

    from posenc.eval.progress import StageLines

    out, now = io.StringIO(), [0.0]

    def clock() -> float:
        now[0] += 20.0  # each batch takes 20 s
        return now[0]

    tokens = np.random.default_rng(0).integers(0, 256, 4097)
    progress = StageLines(Console(file=out, width=200), every_s=30.0, clock=clock)
    per_position(Constant(), {64: corpus_batches(tokens, 64, 4096, batch_tokens=512)}, train_length=32,
                 progress=progress)
    lines = out.getvalue().splitlines()
    assert lines[0] == "per-position loss at length 64 (2×): started (64 windows)"
    assert any(line.startswith("per-position loss at length 64 (2×): 16/64 windows") and "ETA" in line
               for line in lines[1:-1])  # 8 windows a batch; a line at most every 30 s
    assert lines[-1].startswith("per-position loss at length 64 (2×): done  (")


def test_a_learned_tables_figure_ends_at_its_last_defined_length_and_names_the_others(tmp_path, monkeypatch):
    """A learned run's figure ran to 16× with its right half empty."""
    import posenc.eval.per_position as module

    kept = []
    monkeypatch.setattr(module, "save_figure", lambda fig, path: kept.append(fig) or path)
    model = GPT(256, Learned(32, 4, max_len=64), n_layer=1, n_head=4, d_model=32)
    tokens = np.random.default_rng(0).integers(0, 256, 2049)
    record = per_position(model, {L: corpus_batches(tokens, L, 1024) for L in (64, 256, 1024)}, train_length=64)
    write_per_position(record, tmp_path, "learned: per-position loss")
    [ax] = kept[0].axes
    assert ax.get_xlim()[1] < 128  # the axis ends at 64, the longest length with a curve
    assert "no positions at 256 (4×), 1,024 (16×)" in ax.get_title()


def test_a_tasks_answers_make_one_line_not_dots_between_gaps(tmp_path, monkeypatch):
    """Flip-flop's answers are every few positions; the bins between them have no target, and
    drawn as gaps they left each answer a lone dot."""
    import posenc.eval.per_position as module

    kept = []
    monkeypatch.setattr(module, "save_figure", lambda fig, path: kept.append(fig) or path)
    x = torch.zeros(2, 32, dtype=torch.int64)
    y = torch.full((2, 32), IGNORE_INDEX)
    y[:, 3::4] = 1  # an answer every 4th position
    record = per_position(Constant(), {32: [Batch(x, y)]}, train_length=32)
    r = record["lengths"][0]
    empty = [(s, e) for s, e, v in zip(r["start"], r["end"], r["loss"]) if v is None]
    assert empty and all(not any(s <= p < e for p in range(3, 32, 4)) for s, e in empty)  # the record keeps them
    write_per_position(record, tmp_path)
    [ax] = kept[0].axes
    [curve] = [line for line in ax.get_lines() if line.get_label().startswith("32 (1×")]
    assert len(curve.get_xdata()) == len(r["loss"]) - len(empty) and not np.isnan(curve.get_ydata()).any()
