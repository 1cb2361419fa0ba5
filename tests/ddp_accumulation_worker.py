"""Run by tests/test_ddp.py, under torchrun (2 processes) or alone: a few train_steps with gradient
accumulation over one global batch, counting DDP's all-reduces with a communication hook.

    python ddp_accumulation_worker.py OUT_DIR STEPS GRAD_ACCUM GLOBAL_BATCH

Each micro-batch is a (GLOBAL_BATCH, T+1) window drawn from one seeded generator; with N
processes rank r takes rows r·B .. (r+1)·B − 1 (B = GLOBAL_BATCH / N), so N processes and one
process see the same tokens. Rank 0 writes OUT_DIR/result.json (losses averaged over ranks, and
one (step, micro-batch, bucket) record per hook call) and OUT_DIR/params.safetensors.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from posenc.build import build_model
from posenc.data.batches import Batch
from posenc.config import compose
from posenc.hardware import autocast_context
from posenc.train import distributed
from posenc.train.state import micro_batches, new_train_state, train_step

T, VOCAB = 16, 64


class RankRows:
    """This rank's rows of each global micro-batch; counts the micro-batches drawn."""

    def __init__(self, global_batch: int) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self.global_batch, self.drawn = global_batch, 0
        self.rows = global_batch // distributed.world_size()

    def next(self) -> Batch:
        window = torch.randint(VOCAB, (self.global_batch, T + 1), generator=self.generator)
        self.drawn += 1
        mine = window[distributed.rank() * self.rows: (distributed.rank() + 1) * self.rows]
        return Batch(mine[:, :-1], mine[:, 1:])


def main(out: Path, steps: int, grad_accum: int, global_batch: int) -> None:
    distributed.init()
    cfg = compose(["model.n_layer=1", "model.n_head=2", "model.d_model=32", f"trainer.seq_len={T}",
                   f"trainer.grad_accum={grad_accum}", f"trainer.max_steps={steps}", "trainer.warmup_steps=1",
                   "trainer.compile=false"], bench=False)
    torch.manual_seed(0)
    device = torch.device("cpu")
    batches = RankRows(global_batch)
    state = new_train_state(build_model(cfg, VOCAB), cfg.trainer, batches, device, autocast_context("fp32", device))
    calls: list[tuple[int, int, int]] = []  # (optimizer step, micro-batch within it, bucket) per all-reduce

    def counting_allreduce(process_group, bucket):
        calls.append((state.step, (batches.drawn - 1) % grad_accum, bucket.index()))
        return allreduce_hook(process_group, bucket)

    if distributed.active():
        state.step_model.register_comm_hook(None, counting_allreduce)
    losses = [float(distributed.mean(train_step(state, micro_batches(state)).loss)) for _ in range(steps)]
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"losses": losses, "calls": calls}))
        save_file({k: v.clone() for k, v in state.model.state_dict().items()}, str(out / "params.safetensors"))
    del state  # the DDP wrapper (its reducer and comm hook) goes before the process group does
    gc.collect()
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
