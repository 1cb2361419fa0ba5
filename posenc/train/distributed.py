"""Multi-GPU data parallelism with torch DDP, launched by torchrun.

``torchrun --nproc_per_node=N -m posenc train ...`` starts N copies of the CLI (a submitit job
of N tasks runs N copies of its Hydra job: job_tasks_as_ranks); each reads
RANK / WORLD_SIZE / LOCAL_RANK from the environment, joins one process group (gloo on CPU,
NCCL for CUDA tensors) and trains a DDP-wrapped model on its shard of every global batch.
Rank 0 alone writes the run dir's files (metrics, checkpoints, W&B); the global batch is
world_size × trainer.batch_size, so N processes train like one process with N× the batch.
With gradient accumulation the gradients are all-reduced once per optimizer step, on the last
micro-batch (``no_sync`` before it), not once per micro-batch.
"""

from __future__ import annotations

import inspect

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import timedelta

import torch
import torch.distributed as dist


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher) with WORLD_SIZE > 1."""
    return requested_world_size() > 1


def requested_world_size() -> int:
    """The processes the launcher started (WORLD_SIZE; 1 without one), known before the group is joined."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def requested_per_node() -> int:
    """Processes per node (LOCAL_WORLD_SIZE, which torchrun and submitit's environment set; else all)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", requested_world_size()))


def under_torchrun() -> bool:
    """Whether torchrun's elastic agent started this process (it sets TORCHELASTIC_RUN_ID for its workers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launch_command(world_size: int, per_node: int | None = None) -> str:
    """What starts `posenc` on world_size processes, for a printed command: ``posenc`` alone, or
    ``torchrun --standalone --nproc_per_node=N -m posenc`` on one node (``--nnodes=M`` across
    nodes, where the user adds their rendezvous: torchrun's --rdzv-endpoint)."""
    per_node = per_node or world_size
    if world_size <= 1:
        return "posenc"
    if per_node >= world_size:
        return f"torchrun --standalone --nproc_per_node={world_size} -m posenc"
    return f"torchrun --nnodes={world_size // per_node} --nproc_per_node={per_node} -m posenc"


def init() -> None:
    """Join the process group described by the environment (once)."""
    if not launched() or dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))


def in_job_of_tasks() -> bool:
    """Whether this process is one task of a submitit job of several (Hydra's submitit launchers
    with ``hydra.launcher.tasks_per_node`` × ``nodes`` > 1)."""
    if "SUBMITIT_EXECUTOR" not in os.environ:  # submitit sets it in every job it starts
        return False
    import submitit  # the slurm extra: hydra-submitit-launcher's dependency

    return submitit.JobEnvironment().num_tasks > 1


@contextmanager
def job_tasks_as_ranks() -> Iterator[bool]:
    """Inside a submitit job of several tasks, the tasks as one DDP run for the block (True);
    elsewhere nothing (False). Each task runs the same Hydra job; it joins one process group
    through torch's env:// rendezvous, exported from the job's environment by submitit's
    ``TorchDistributedEnvironment`` (on SLURM: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS and the
    first host of the job's node list, a port drawn from the job id; the local executor's own
    variables), and leaves it after. Each task keeps every GPU the job has and takes its own by
    LOCAL_RANK (posenc.hardware.process_device)."""
    if not in_job_of_tasks() or dist.is_initialized():
        yield False
        return
    import submitit

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    init()
    finished = False
    try:
        yield True
        finished = True
    finally:
        shutdown(wait=finished)


# set for a block that computes as one process although this process is a rank (alone())
_ALONE: ContextVar[bool] = ContextVar("posenc_alone", default=False)


@contextmanager
def alone() -> Iterator[None]:
    """For the block, this process as a run of its own although it is one rank of a process group:
    every collective below is skipped, rank 0 and a world of 1. `posenc check`'s verdict is measured
    on rank 0 alone (its resume row trains, saves and resumes a model), and the other ranks, which
    never take those steps, must not be waited for in them (a gloo collective that never completes)."""
    token = _ALONE.set(True)
    try:
        yield
    finally:
        _ALONE.reset(token)


def active() -> bool:
    return not _ALONE.get() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP averages gradients over ranks in backward, so every rank takes the same step."""
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    # no buffer broadcast before each forward: every buffer of posenc's models is a constant or a cache each
    # rank computes from the config (RoPE's tables, ALiBi's slopes), never learned state, so a forward needs
    # no collective, and a step that fails in one rank's forward leaves no broadcast for the others to wait
    # in (train/recovery.py). torch 2.13 names that forward_sync_buffers and deprecates broadcast_buffers
    # (a FutureWarning from every rank); the new name still syncs the buffers once at construction, which
    # copies rank 0's constants onto equal ones
    forward_only = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   **({"forward_sync_buffers": False} if forward_only else {"broadcast_buffers": False}))


def no_sync(step_model: torch.nn.Module, skip: bool) -> AbstractContextManager:
    """While skip, DDP's ``no_sync()``: backward accumulates gradients locally, without the
    all-reduce (a micro-batch that is not the step's last). Otherwise, or without DDP, nothing.
    step_model may be the DDP module or torch.compile's wrapper around it."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = getattr(step_model, "_orig_mod", step_model)  # torch.compile keeps the module it wraps here
    return ddp.no_sync() if skip and isinstance(ddp, DistributedDataParallel) else nullcontext()


def mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar over ranks (every rank gets it)."""
    if not active():
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / world_size()


def sum_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """A tensor summed element-wise over ranks (every rank gets the sum); itself without DDP."""
    if not active():
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def any_rank(flag: bool) -> bool:
    """True on every rank when flag is true on at least one (e.g. a SIGTERM seen by one rank)."""
    if not active():
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast(obj):
    """Rank 0's obj on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(wait: bool = True) -> None:
    """Leave the process group. wait: first a barrier, so no rank tears its connections down while
    another still finishes its last step; not after a failure, where the others may never come.
    Whatever holds a DDP wrapper (a communication hook's closure, say) must be freed before this:
    a DDP reducer outliving its process group aborts at exit ("terminate called without an
    active exception")."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
