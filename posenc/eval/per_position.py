"""Per-position loss: mean next-token loss against the position inside the window.

Perplexity at a length averages over every position of the window and hides *where* an
encoding breaks: a model trained on L tokens that is fine up to position L and falls apart
after it shows a flat curve then a cliff at L (Press et al., 2022, Fig. 1 plot the same
thing against the evaluation length). The loss at each position is averaged over the windows
in position bins that every evaluation length shares (``position_bins``): each position alone
at the start, where the loss falls fastest, then ``BINS_PER_DOUBLING`` bins per doubling of the
position (equal widths on the figure's log axis), so a bin means the same positions at 1× and
at 16× and two lengths' curves compare point by point (bins sized per length would average 1×'s
first bin over positions 0–3 and 16×'s over 0–63, and make the long windows look better at the
start by that alone). Each bin also carries the spread of its loss across windows: the 95%
t-interval of the mean of the windows' own means in it, the band the figure draws.

The windows cover what the rest of the evaluator scores: the fixed validation span of a corpus
(cut as the packing says, as ``posenc.eval.loss.score_windows``), or a synthetic task's
evaluation instances, where only the answer positions are targets (IGNORE_INDEX elsewhere, so a
bin without answers is null). Under documents packing the loss is also reported against the
position inside the document (``document``), the position the model sees.

With ``eval.stride=S`` the corpus windows start every S tokens, as the sliding perplexity's do,
but every position of every window is scored: a curve against the position needs each window's
early positions too (the sliding perplexity scores only a window's last S targets, which would
leave positions below length − S with the first window alone). The curve then averages over
length/S times more (overlapping) windows; without a stride the windows do not overlap. Windows
that overlap are not independent draws, so under a stride the band is narrower than the
uncertainty it stands for (the figure's title says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posenc.data.batches import IGNORE_INDEX, Batch
from posenc.data.synthetic import SyntheticTask, make_task, targets_of
from posenc.data.windows import Packing, Windows
from posenc.display.figures import legend_below, log2_positions, pyplot, save_figure
from posenc.eval.position_bins import BinStats, describe_bins, position_bins
from posenc.eval.progress import stage_label
from posenc.nn.encodings.base import PositionOutOfRange
from posenc.record.directory import write_json_atomic
from posenc.record.rundir import PER_POSITION_STEM

STEM = PER_POSITION_STEM  # per_position.json and per_position.png in the run dir
STAGE = "per-position loss"  # its progress lines: 'per-position loss at length 256 (1×): …'


@torch.no_grad()
def position_losses(model: nn.Module, batches: Iterable[Batch], length: int, edges: np.ndarray,
                    device: torch.device | str = "cpu", autocast=nullcontext, progress=None
                    ) -> tuple[BinStats, BinStats | None]:
    """The loss of every target of batches of (b, length) windows, in the position bins of edges:
    against the position in the window, and, for batches that carry positions inside documents,
    against those (else None); targets equal to IGNORE_INDEX are not counted."""
    window, document = BinStats(edges), BinStats(edges)
    in_documents = False
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            batch = batch.to(device)
            with autocast():
                logits, _ = model(batch.x, **batch.model_inputs())  # (b, length, vocab)
            loss = F.cross_entropy(logits.float().transpose(1, 2), batch.y, reduction="none",
                                   ignore_index=IGNORE_INDEX).double().cpu().numpy()  # (b, length), 0 where ignored
            scored = (batch.y != IGNORE_INDEX).cpu().numpy()
            if progress is not None:
                progress.advance(loss.shape[0], getattr(batches, "windows", None))
            window.add(loss, scored, np.broadcast_to(np.arange(length), loss.shape))
            if batch.pos is not None:  # positions restart in each document: the position the model sees
                in_documents = True
                document.add(loss, scored, batch.pos.cpu().numpy())
    finally:
        model.train(was_training)
    return window, document if in_documents else None


def per_position(model: nn.Module, batches_by_length: dict[int, Iterable[Batch]], train_length: int,
                 device: torch.device | str = "cpu", autocast=nullcontext, progress=None,
                 kept: dict[int, dict] | None = None, on_length: Callable[[dict], None] | None = None) -> dict:
    """The per-position record of a model: for each length its curve on the shared position bins
    (and how many windows it averages, where known), or None with the reason when the encoding has
    no positions there (learned beyond max_len). progress (posenc.eval.progress.StageLines) hears of
    each length; a length in kept (an interrupted evaluation's record of it) is taken as it is;
    on_length(record so far) after each length computed here."""
    lengths = sorted(batches_by_length)
    edges = position_bins(max(lengths), lengths)
    stride = getattr(next(iter(batches_by_length.values()), None), "stride", None)
    record = {"train_length": train_length, "edges": edges.tolist(), "bins": describe_bins(edges), "stride": stride,
              "lengths": []}
    for length, batches in batches_by_length.items():
        label = stage_label(STAGE, length, length / train_length)
        if kept and length in kept:
            record["lengths"].append(kept[length])
            if progress is not None:
                progress.keep(label, kept[length].get("skipped") or "done")
            continue
        entry = {"length": length, "multiple": length / train_length}
        if getattr(batches, "windows", None) is not None:
            entry["windows"] = batches.windows
        if progress is not None:
            progress.begin(label, getattr(batches, "windows", None))
        max_len = getattr(getattr(model, "encoding", None), "max_len", None)
        try:
            if max_len is not None and length > max_len:
                raise PositionOutOfRange(f"{model.encoding.name} has no positions beyond {max_len - 1}")
            window, document = position_losses(model, batches, length, edges, device, autocast, progress)
            entry.update(window.curve(length))
            if document is not None:
                entry["document"] = document.curve(length)
        except PositionOutOfRange as e:
            entry.update(start=None, end=None, loss=None, count=None, skipped=f"not defined: {e}")
        if progress is not None:
            progress.end(entry.get("skipped") or "done")
        record["lengths"].append(entry)
        if on_length is not None:
            on_length(record)
    return record


@dataclass(frozen=True)
class Batches:
    """The batches of one length, and how many windows they hold and how they were placed (the
    stride between window starts, None: non-overlapping): for progress and the record."""
    batches: Iterable[Batch]
    windows: int
    stride: int | None = None

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)


def corpus_batches(tokens: Windows | np.ndarray, length: int, span: int, batch_tokens: int = 16384,
                   stride: int | None = None) -> Batches:
    """Windows of ``length`` over targets [0, span) of a validation split (cut as its packing says;
    a bare token array as concat): non-overlapping, or starting every ``stride`` tokens with every
    position scored (module doc)."""
    windows = tokens if isinstance(tokens, Windows) else Windows(np.asarray(tokens), Packing.concat())
    starts = windows.starts(span, length, stride)  # refuses a stride the packing cannot honour
    if stride is not None and stride < length:
        starts = [(s, 0) for s in range(0, span - length + 1, stride)]
    batches = (batch for batch, _ in windows.batches(starts, length, max(1, batch_tokens // length)))
    return Batches(batches, len(starts), stride if stride is not None and stride < length else None)


def task_batches(spec: SyntheticTask, length: int, seed: int = 0, batch_tokens: int = 16384) -> Iterator[Batch]:
    """The task's evaluation instances at ``length`` (those task accuracy scores), with the
    targets training used (spec.targets)."""
    ds = make_task(spec.task, length, spec.eval_instances, seed, **spec.options).with_format("torch")
    per = max(1, batch_tokens // length)
    for i in range(0, spec.eval_instances, per):
        rows = ds[i : i + per]
        yield Batch(*targets_of(rows["ids"], rows["answer_mask"], spec.targets))


def as_table_rows(record: dict) -> list[list]:
    """[length, position (bucket centre), loss] rows of every defined bucket: a W&B table."""
    rows = []
    for r in record["lengths"]:
        if r["loss"] is None:
            continue
        rows += [[r["length"], (s + e - 1) / 2, loss] for s, e, loss in zip(r["start"], r["end"], r["loss"])
                 if loss is not None]
    return rows


def write_per_position(record: dict, out_dir: Path, title: str = "", stem: str = STEM) -> list[Path]:
    """<stem>.json and <stem>.png (loss against position, one line per length on the shared
    position bins, its band the 95% interval over windows, a dashed vertical line at the training
    length; a second panel against the position inside the document where the record has one) in
    out_dir. The position axis is logarithmic (symlog, base 2, linear below 1 so position 0 is on
    it): each doubling of the context gets the same width, so the positions up to the training
    length are not squeezed into the first 1/16 of a 16× figure. Neighbouring lengths take
    neighbouring colours of the colour-blind safe palette, which differ in hue (a sequential map
    makes 1,024 and 2,048 two near-identical greens), each with its own marker."""
    from posenc.report.style import FREE_MARKERS, PALETTE  # start-up: the figures' one palette

    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
    write_json_atomic(json_path, record)
    panels = [("position in the window", None)]
    if any(r.get("document") for r in record["lengths"]):
        panels.append(("position in the document", "document"))
    train_length = record["train_length"]
    lengths = sorted(record["lengths"], key=lambda r: r["length"])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 3.8), squeeze=False)
    # the axis ends at the longest length with a curve: a learned table has none past max_len, and
    # its 16× would leave the right half of the figure empty; the title names the lengths left out
    defined = [r for r in lengths if r["loss"] is not None]
    undefined = [f"{r['length']:,} ({r['multiple']:g}×)" for r in lengths if r["loss"] is None]
    banded = False
    for ax, (xlabel, key) in zip(axes[0], panels):
        means: list[float] = []
        for i, r in enumerate(lengths):
            curve = r if key is None else r.get(key)
            if not curve or curve["loss"] is None:
                continue
            colour, marker = PALETTE[i % len(PALETTE)], FREE_MARKERS[i % len(FREE_MARKERS)]
            # a bin without a target (a task's positions between answers) is left out, not a gap:
            # the answers' curve stays one line instead of dots between gaps
            bins = [((s + e - 1) / 2, v, lo, hi) for s, e, v, lo, hi in
                    zip(curve["start"], curve["end"], curve["loss"], curve.get("low") or [None] * len(curve["loss"]),
                        curve.get("high") or [None] * len(curve["loss"])) if v is not None]
            z = 3 + len(lengths) - i  # the shortest on top
            windows = f", {r['windows']:,} windows" if r.get("windows") else ""
            # the positions a shorter length scores too, from more windows, faded: each length stands out
            # where it adds positions (a causal model sees the same context at p in any window)
            shorter = max((d["length"] for d in defined if d["length"] < r["length"]), default=0)
            k = next((j for j, b in enumerate(bins) if b[0] >= shorter), len(bins))  # the first bin it adds
            for part, alpha in ((bins[:k], 0.3), (bins[max(k - 1, 0):], 1)):  # joined at bin k - 1
                if not part:
                    continue
                x, y, low, high = zip(*part)
                ax.plot(x, y, marker=marker, markersize=3.5, markerfacecolor="none", linewidth=1.2, color=colour,
                        zorder=z, alpha=alpha, label=f"{r['length']:,} ({r['multiple']:g}×{windows})" if alpha == 1 else None)
                means += y
                band = [(xi, lo, hi) for xi, lo, hi in zip(x, low, high) if lo is not None]
                if band:
                    bx, blo, bhi = zip(*band)
                    ax.fill_between(bx, blo, bhi, color=colour, alpha=0.12 * alpha, linewidth=0, zorder=z - 0.5)
                    banded = True
        if means:  # the axis holds the curves; a band from a few windows (16×'s first positions) runs off it
            pad = 0.15 * (max(means) - min(means) or 1.0)
            ax.set_ylim(max(0.0, min(means) - pad), max(means) + pad)
        ax.axvline(train_length, color="black", linestyle="--", linewidth=1, label=f"training length {train_length:,}")
        log2_positions(ax, max(r["length"] for r in defined or lengths), train_length)
        ax.set_xlabel(f"{xlabel} (log scale; {record.get('bins') or 'bins'})", fontsize=8)
        ax.set_ylabel("loss (nats/token)")
        notes = [f"no positions at {', '.join(undefined)}" if undefined else "",
                 "overlapping windows (eval.stride): the band understates the uncertainty"
                 if record.get("stride") and banded else ""]
        ax.set_title("\n".join(filter(None, [title or "per-position loss", *notes])), fontsize=9)
    fig.tight_layout()
    notes = ["evaluation length (× training length)", "band: 95% interval of the mean over its windows" if banded else "",
             "faded: positions a shorter length scores too" if len(defined) > 1 else ""]
    legend_below(list(axes[0]), title="\n".join(filter(None, notes)))
    return [json_path, save_figure(fig, png_path)]


def log_to(tracker, record: dict, figure: Path, step: int, tokens: int) -> None:
    """Per-position loss to W&B: a table/line chart (one line per length) and the PNG."""
    tracker.log_curve("per_position/loss", ["length", "position", "loss"], as_table_rows(record), "position", "loss",
                      step, tokens, stroke="length", title="loss against position, per evaluation length")
    tracker.log_images({"per_position/figure": figure}, step, tokens)
