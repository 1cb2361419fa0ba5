"""Run by tests/test_kernel_fallback_ddp.py under torchrun (2 CPU processes, gloo): two compiled
training steps of t5_bias with FlexAttention planned, whose compilation fails on rank 1 alone
(tests/compile_failures.py: flex_at_compile_on_rank_1). Each rank writes OUT_DIR/rank<r>.json: its
kernel record, its steps, losses and a checksum of its parameters.

    python ddp_recovery_worker.py OUT_DIR
"""

from __future__ import annotations

import gc
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from compile_failures import flex_on_the_cpu

from posenc.build import build_model
from posenc.config import compose
from posenc.data.batches import Batch
from posenc.nn import kernels
from posenc.train import distributed
from posenc.train.state import micro_batches, new_train_state, train_step

T, VOCAB = 32, 64


class Rows:
    """This rank's rows of one fixed global batch of 8 windows."""

    def __init__(self) -> None:
        window = torch.randint(VOCAB, (8, T + 1), generator=torch.Generator().manual_seed(0))
        mine = window[distributed.rank() * 4: (distributed.rank() + 1) * 4]
        self.batch = Batch(mine[:, :-1], mine[:, 1:])

    def next(self) -> Batch:
        return self.batch


def main(out: Path) -> None:
    distributed.init()
    patch = pytest.MonkeyPatch()
    flex_on_the_cpu(patch)
    patch.setattr(kernels, "DEFAULT_SHARED_MEMORY", 16 * 4 * (32 + 2 * 32))  # a ladder of two rungs
    os.environ[kernels.BACKEND_VARIABLE] = "compile_failures:flex_at_compile_on_rank_1"
    cfg = compose(["encoding=t5_bias", "model.n_layer=1", "model.n_head=2", "model.d_model=32", f"trainer.seq_len={T}",
                   "trainer.grad_accum=2", "trainer.max_steps=2", "trainer.warmup_steps=1", "trainer.compile=true"],
                  bench=False)
    torch.manual_seed(0)
    state = new_train_state(build_model(cfg, VOCAB), cfg.trainer, Rows(), torch.device("cpu"), nullcontext)
    losses = [float(train_step(state, micro_batches(state)).loss) for _ in range(2)]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{distributed.rank()}.json").write_text(json.dumps({
        "kernels": state.kernels.record(), "step": state.step, "losses": losses,
        "compiled": hasattr(state.step_model, "_orig_mod"),
        "params": [float(p.double().sum()) for p in state.model.parameters()]}))
    del state  # the DDP wrapper goes before the process group does
    gc.collect()
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
