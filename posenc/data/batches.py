"""Training batches: random windows of the packed token array, resumable; and the batch itself.
(Evaluation windows are fixed and live with the evaluator, posenc.eval.loss.)"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from posenc.errors import UserError

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: a target that is not scored

if TYPE_CHECKING:
    from posenc.data.windows import Packing


@dataclass(frozen=True)
class Batch:
    """What one forward needs: inputs and targets, and, under documents packing, what the mask
    and the encodings need (the model's ``forward(x, y, **batch.model_inputs())``).

    x, y: (B, T) int64; pos: (B, T) each token's position inside its document; doc: (B, T)
    document ids within each window; length: max(pos) + 1, known on the host."""

    x: Tensor
    y: Tensor
    pos: Tensor | None = None
    doc: Tensor | None = None
    length: int | None = None

    def to(self, device: torch.device | str) -> Batch:
        """On CUDA through pinned memory with non_blocking=True, so the copy overlaps the
        previous step's kernels instead of stalling the host."""
        device = torch.device(device)

        def move(t: Tensor | None) -> Tensor | None:
            if t is None or t.device == device:
                return t
            return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

        return replace(self, x=move(self.x), y=move(self.y), pos=move(self.pos), doc=move(self.doc))

    def model_inputs(self) -> dict:
        """Keyword arguments of GPT.forward beyond (x, y): none for a plain causal window."""
        if self.doc is None:
            return {}
        return {"pos": self.pos, "doc": self.doc, "length": self.length}

    @property
    def tokens(self) -> int:
        return self.y.numel()


class RandomWindows:
    """Training batches: random windows of seq_len+1 tokens (x = w[:-1], y = w[1:]), cut as the
    packing says (posenc/data/windows.py); concat when none is given.

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
        from posenc.data.windows import Packing

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
