"""Training batches: random windows of the packed token array, resumable. (Evaluation windows
are fixed and live with the evaluator, posenc.eval.loss.)"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posenc.errors import UserError


class RandomWindows:
    """Training batches: random windows of seq_len+1 tokens (x = w[:-1], y = w[1:]).

    Offsets come from a seeded torch.Generator whose state can be saved and restored, so a
    resumed run draws the same batches as an uninterrupted one.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1) -> None:
        if len(tokens) < seq_len + 2:
            raise UserError(
                f"the training split has {len(tokens)} tokens, fewer than one window of "
                f"trainer.seq_len+1={seq_len + 1} — use a larger corpus or a smaller trainer.seq_len"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[Tensor, Tensor]:
        """(B, T) inputs and targets, int64, on CPU."""
        # every rank draws the global batch and keeps its own shard: same data as one process
        ix = torch.randint(0, len(self.tokens) - self.seq_len - 1,
                           (self.batch_size * self.world_size,), generator=self.generator)
        ix = ix[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        w = torch.from_numpy(np.stack([self.tokens[i : i + self.seq_len + 1] for i in ix.tolist()]).astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
