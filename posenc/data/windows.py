"""How windows are cut from a packed split, by document (``dataset.packing``).

The packed split is one flat token array with the offsets where its documents start. A window is
``length + 1`` consecutive tokens (x = w[:-1], y = w[1:]); the packing decides where windows may
start and what the model is told about the documents inside them:

- ``concat`` (nanoGPT): anywhere; positions 0..length-1 run across document boundaries and every
  token attends to its whole causal past, another document's tail included;
- ``bos_aligned`` (modded-nanogpt): at a document start, drawn uniformly over the documents that
  leave room for a whole window; the window runs on into the next documents as in concat;
- ``documents`` (torchtitan's ``block_causal``, Llama 3's pretraining): anywhere, as concat, but
  the batch carries each token's document id (no token attends across a document) and its
  position inside its document (0 at every document start; a document cut by the window start
  counts from the window start).

The tokens a window holds are the same under concat and documents (the same draws), so those two
compare the mask and the positions alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from posenc.data.batches import Batch
from posenc.data.corpora import PACKINGS
from posenc.errors import UserError


@dataclass(frozen=True)
class Packing:
    """A packing kind and the document starts of the split it cuts: starts (documents,) int64,
    ascending, starts[0] = 0."""

    kind: str
    starts: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in PACKINGS:
            raise UserError(f"packing (dataset.packing, eval.packing) must be one of {', '.join(PACKINGS)}, "
                            f"got '{self.kind}'")

    @classmethod
    def concat(cls) -> Packing:
        return cls("concat", np.zeros(1, dtype=np.int64))

    def aligned_offsets(self, n_tokens: int, length: int) -> np.ndarray:
        """Document starts that leave room for a window of length + 1 tokens."""
        valid = self.starts[self.starts <= n_tokens - length - 1]
        if len(valid) == 0:
            raise UserError(f"no document starts early enough for a window of {length + 1} tokens — "
                            f"use dataset.packing=concat or a shorter trainer.seq_len")
        return valid

    def documents(self, offsets: np.ndarray, length: int) -> np.ndarray:
        """Document ids of the tokens of windows starting at ``offsets`` (n,): (n, length) int64,
        numbered from 0 at each window's first token."""
        index = offsets[:, None] + np.arange(length)[None, :]
        doc = np.searchsorted(self.starts, index, side="right") - 1  # the document of each token
        return doc - doc[:, :1]

    def positions(self, offsets: np.ndarray, length: int) -> np.ndarray:
        """Each token's position inside its document, counted from the window start for the
        document the window cuts: (n, length) int64, 0 at every document start."""
        index = offsets[:, None] + np.arange(length)[None, :]
        start = self.starts[np.searchsorted(self.starts, index, side="right") - 1]
        return index - np.maximum(start, offsets[:, None])

    def batch(self, tokens: np.ndarray, offsets: np.ndarray, length: int) -> Batch:
        """The windows of length + 1 tokens starting at offsets as one batch: (n, length) each."""
        w = torch.from_numpy(np.stack([tokens[s : s + length + 1] for s in offsets.tolist()]).astype(np.int64))
        if self.kind != "documents":
            return Batch(w[:, :-1], w[:, 1:])
        pos = self.positions(offsets, length)
        return Batch(w[:, :-1], w[:, 1:], pos=torch.from_numpy(pos), doc=torch.from_numpy(self.documents(offsets, length)),
                     length=int(pos.max()) + 1)


@dataclass(frozen=True)
class Windows:
    """A split's tokens and how evaluation windows are cut from them."""

    tokens: np.ndarray
    packing: Packing

    def __len__(self) -> int:
        return len(self.tokens)

    def starts(self, span: int, length: int, stride: int | None) -> list[tuple[int, int]]:
        """(start, first scored target in the window) of the windows that score targets
        [0, span): each exactly once (non-overlapping, or sliding by stride, Press et al. §4);
        with bos_aligned, non-overlapping windows each starting at a document start, the targets
        between a window's end and the next document start left unscored."""
        if self.packing.kind != "bos_aligned":
            return sliding_windows(span, length, stride)
        if stride is not None:
            raise UserError("eval.stride scores overlapping windows, which cannot all start at a document — "
                            "use eval.packing=concat or documents with eval.stride")
        out, cursor = [], 0
        starts = self.packing.starts
        while True:
            i = np.searchsorted(starts, cursor, side="left")
            if i == len(starts) or starts[i] + length > span:
                return out
            out.append((int(starts[i]), 0))
            cursor = int(starts[i]) + length

    def batches(self, windows: list[tuple[int, int]], length: int, batch: int) -> Iterator[tuple[Batch, int]]:
        """Windows grouped by their first scored target (all equal but the first and the last
        when sliding) into batches of at most ``batch``: (Batch of (b, length), first scored)."""
        i = 0
        while i < len(windows):
            j = i
            while j < len(windows) and j - i < batch and windows[j][1] == windows[i][1]:
                j += 1
            offsets = np.asarray([s for s, _ in windows[i:j]], dtype=np.int64)
            yield self.packing.batch(self.tokens, offsets, length), windows[i][1]
            i = j


def fixed_span(n_tokens: int, length: int, windows: int | None = None) -> int:
    """Targets in the first ``windows`` non-overlapping windows of ``length`` that the split
    holds (each window reads length+1 tokens); every window if ``windows`` is None."""
    available = (n_tokens - 1) // length
    if available < 1:
        raise UserError(f"the validation split has {n_tokens} tokens, fewer than one window of {length + 1} "
                        f"— use a shorter length or a larger dataset")
    return (available if windows is None else min(windows, available)) * length


def sliding_windows(span: int, length: int, stride: int | None) -> list[tuple[int, int]]:
    """(start, first scored target offset in the window) for windows covering targets
    [0, span) exactly once. stride None: non-overlapping windows, all targets scored."""
    if stride is None or stride >= length:
        return [(s, 0) for s in range(0, span - length + 1, length)]
    windows = [(0, 0)]  # the first window scores everything
    end = length
    while end < span:
        step = min(stride, span - end)
        end += step
        windows.append((end - length, length - step))
    return windows


class RandomWindows:
    """Training batches: random windows of seq_len+1 tokens (x = w[:-1], y = w[1:]), cut as the
    packing says (Packing, above); concat when none is given.

    Offsets come from a seeded torch.Generator whose state can be saved and restored, so a
    resumed run draws the same batches as an uninterrupted one. concat and documents draw the
    same offsets from the same seed: the same tokens, told apart by the mask alone.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, packing: Packing | None = None) -> None:
        if len(tokens) < seq_len + 2:
            raise UserError(
                f"the training split has {len(tokens)} tokens, fewer than one window of "
                f"trainer.seq_len+1={seq_len + 1} — use a larger corpus or a smaller trainer.seq_len"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.packing = packing or Packing.concat()
        # bos_aligned draws among the document starts that leave room for a window
        self.aligned = self.packing.aligned_offsets(len(tokens), seq_len) if self.packing.kind == "bos_aligned" else None
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> Batch:
        """(B, T) inputs and targets, int64, on CPU (with documents and positions under documents packing)."""
        # every rank draws the global batch and keeps its own shard: same data as one process
        high = len(self.tokens) - self.seq_len - 1 if self.aligned is None else len(self.aligned)
        ix = torch.randint(0, high, (self.batch_size * self.world_size,), generator=self.generator)
        ix = ix[self.rank * self.batch_size : (self.rank + 1) * self.batch_size].numpy()
        offsets = ix if self.aligned is None else self.aligned[ix]
        return self.packing.batch(self.tokens, offsets.astype(np.int64), self.seq_len)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
