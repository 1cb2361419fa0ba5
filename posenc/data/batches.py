"""The batch one forward takes: inputs, targets and, under documents packing, positions and
document ids. (Training windows are drawn by posenc.data.windows.RandomWindows; evaluation
windows are fixed and live with the evaluator, posenc.eval.loss.)"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: a target that is not scored


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
