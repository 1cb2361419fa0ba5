"""Per-position loss: mean next-token loss against the position inside the window.

Perplexity at a length averages over every position of the window and hides *where* an
encoding breaks: a model trained on L tokens that is fine up to position L and falls apart
after it shows a flat curve then a cliff at L (Press et al., 2022, Fig. 1 plot the same
thing against the evaluation length). For each evaluation length the loss at positions
0..length-1 is summed over the windows and cut into at most ``buckets`` equal-width buckets
of positions, so the record stays small at 16× the training length.

The windows cover what the rest of the evaluator scores: the fixed validation span of a corpus
(cut as the packing says, as ``posenc.eval.loss.score_windows``), or a synthetic task's
evaluation instances, where only the answer positions are targets (IGNORE_INDEX elsewhere, so a
bucket without answers is null). Under documents packing the loss is also reported against the
position inside the document (``document``), the position the model sees.

With ``eval.stride=S`` the corpus windows start every S tokens, as the sliding perplexity's do,
but every position of every window is scored: a curve against the position needs each window's
early positions too (the sliding perplexity scores only a window's last S targets, which would
leave positions below length − S with the first window alone). The curve then averages over
length/S times more (overlapping) windows; without a stride the windows do not overlap.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.data.batches import IGNORE_INDEX, Batch
from posenc.data.synthetic import SyntheticTask, make_task, targets_of
from posenc.data.windows import Packing, Windows
from posenc.display.figures import legend_below, log2_positions, pyplot, save_figure
from posenc.nn.encodings.base import PositionOutOfRange
from posenc.record.directory import write_json_atomic
from posenc.record.rundir import PER_POSITION_STEM

BUCKETS = 64  # at most this many points per length
STEM = PER_POSITION_STEM  # per_position.json and per_position.png in the run dir


@torch.no_grad()
def position_loss_sums(model: nn.Module, batches: Iterable[Batch], length: int, device: torch.device | str = "cpu",
                       autocast=nullcontext, progress=None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Summed loss and target count at each position 0..length-1 of the window over batches of
    (b, length), and, for batches that carry positions inside documents, the same against those
    positions (else None); targets equal to IGNORE_INDEX are not counted. (length,) arrays."""
    total = torch.zeros(length, dtype=torch.float64)
    count = torch.zeros(length, dtype=torch.int64)
    doc_total, doc_count = torch.zeros_like(total), torch.zeros_like(count)
    in_documents = False
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            batch = batch.to(device)
            with autocast():
                logits, _ = model(batch.x, **batch.model_inputs())  # (b, length, vocab)
            loss = F.cross_entropy(logits.float().transpose(1, 2), batch.y, reduction="none",
                                   ignore_index=IGNORE_INDEX).double().cpu()  # (b, length), 0 where ignored
            scored = (batch.y != IGNORE_INDEX).cpu()
            if progress is not None:
                progress.advance(loss.shape[0], getattr(batches, "windows", None))
            total += loss.sum(0)
            count += scored.sum(0)
            if batch.pos is not None:  # positions restart in each document: the position the model sees
                in_documents = True
                pos = batch.pos.cpu().flatten()
                doc_total.index_add_(0, pos, loss.flatten())
                doc_count.index_add_(0, pos, scored.flatten().long())
    finally:
        model.train(was_training)
    if not in_documents:
        return total.numpy(), count.numpy(), None, None
    return total.numpy(), count.numpy(), doc_total.numpy(), doc_count.numpy()


def bucket(total: np.ndarray, count: np.ndarray, buckets: int = BUCKETS) -> dict:
    """Equal-width buckets of positions: {start, end (exclusive), loss (mean, None when the
    bucket has no target), count} as parallel lists."""
    length = len(total)
    edges = np.unique(np.linspace(0, length, min(buckets, length) + 1).round().astype(int))
    starts, ends = edges[:-1], edges[1:]
    sums = np.add.reduceat(total, starts)
    counts = np.add.reduceat(count, starts)
    loss = [float(s / c) if c else None for s, c in zip(sums, counts)]
    return {"start": starts.tolist(), "end": ends.tolist(), "loss": loss, "count": counts.tolist()}


def per_position(model: nn.Module, batches_by_length: dict[int, Iterable[tuple[Tensor, Tensor]]],
                 train_length: int, buckets: int = BUCKETS, device: torch.device | str = "cpu",
                 autocast=nullcontext, progress=None) -> dict:
    """The per-position record of a model: for each length its bucketed curve (and how many
    windows it averages, where known), or None with the reason when the encoding has no positions
    there (learned beyond max_len); progress (posenc.eval.progress.StageLines) hears of each."""
    lengths = []
    for length, batches in batches_by_length.items():
        record = {"length": length, "multiple": length / train_length}
        if getattr(batches, "windows", None) is not None:
            record["windows"] = batches.windows
        if progress is not None:
            progress.begin(f"per-position loss at length {length:,} ({length / train_length:g}×)")
        max_len = getattr(getattr(model, "encoding", None), "max_len", None)
        try:
            if max_len is not None and length > max_len:
                raise PositionOutOfRange(f"{model.encoding.name} has no positions beyond {max_len - 1}")
            total, count, doc_total, doc_count = position_loss_sums(model, batches, length, device, autocast,
                                                                    progress)
            record.update(bucket(total, count, buckets))
            if doc_total is not None:
                record["document"] = bucket(doc_total, doc_count, buckets)
        except PositionOutOfRange as e:
            record.update(start=None, end=None, loss=None, count=None, skipped=f"not defined: {e}")
        if progress is not None:
            progress.end(record.get("skipped") or "done")
        lengths.append(record)
    stride = getattr(next(iter(batches_by_length.values()), None), "stride", None)
    return {"train_length": train_length, "buckets": buckets, "stride": stride, "lengths": lengths}


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
    """<stem>.json and <stem>.png (loss against position, one line per length, a dashed
    vertical line at the training length; a second panel against the position inside the
    document where the record has one) in out_dir. The position axis is logarithmic (symlog,
    base 2, linear below 1 so position 0 is on it): each doubling of the context gets the same
    width, so the positions up to the training length are not squeezed into the first
    1/16 of a 16× figure."""
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
    colours = plt.get_cmap("viridis_r")(np.linspace(0.15, 1, max(1, len(lengths))))  # ordered: dark = longest
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 3.6), squeeze=False)
    # the axis ends at the longest length with a curve: a learned table has none past max_len,
    # and its 16× would leave the right half of the figure empty (issue 47); the title names them
    defined = [r for r in lengths if r["loss"] is not None]
    undefined = [f"{r['length']:,} ({r['multiple']:g}×)" for r in lengths if r["loss"] is None]
    for ax, (xlabel, key) in zip(axes[0], panels):
        for i, (r, colour) in enumerate(zip(lengths, colours)):
            curve = r if key is None else r.get(key)
            if not curve or curve["loss"] is None:
                continue
            # a bucket without a target (a task's positions between answers) is left out, not a gap:
            # the answers' curve stays one line instead of dots between gaps
            points = [((s + e - 1) / 2, v) for s, e, v in zip(curve["start"], curve["end"], curve["loss"]) if v is not None]
            x, y = zip(*points) if points else ((), ())
            ax.plot(x, y, marker=".", markersize=3, linewidth=1, color=colour, zorder=3 + len(lengths) - i,
                    label=f"{r['length']} ({r['multiple']:g}×)")  # the shortest on top
        ax.axvline(train_length, color="black", linestyle="--", linewidth=1, label=f"training length {train_length}")
        log2_positions(ax, max(r["length"] for r in defined or lengths), train_length)
        ax.set_xlabel(f"{xlabel} (log scale)")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title((title or "per-position loss") + (f"\nno positions at {', '.join(undefined)}" if undefined else ""))
    fig.tight_layout()
    legend_below(list(axes[0]), title="evaluation length (× training length)")
    return [json_path, save_figure(fig, png_path)]


def log_to(tracker, record: dict, figure: Path, step: int, tokens: int) -> None:
    """Per-position loss to W&B: a table/line chart (one line per length) and the PNG."""
    tracker.log_curve("per_position/loss", ["length", "position", "loss"], as_table_rows(record), "position", "loss",
                      step, tokens, stroke="length", title="loss against position, per evaluation length")
    tracker.log_images({"per_position/figure": figure}, step, tokens)
