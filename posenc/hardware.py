"""Device, precision and peak-FLOP facts, so training, evaluation, probes and the benchmark agree.

``setup_device`` is the one device setup all four call: which device (under torchrun, this
process's GPU), which precision and autocast, and TF32 matmuls on CUDA. A run evaluated again
with `posenc eval` or `posenc probe` therefore computes as its in-training evaluation did.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import NamedTuple

import torch

from posenc.errors import UserError
from posenc.record.metrics import MACHINE_CPUS, MACHINE_LOAD

log = logging.getLogger("posenc")

#: dense bf16 peak FLOP/s by device name fragment (vendor datasheets, SXM parts)
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "4090": 165e12}
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(spec: str) -> torch.device:
    """auto | cpu | cuda | cuda:N -> a device that exists, or a UserError saying why not."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UserError(f"device='{spec}' is not a device — use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError("device=cuda was asked for but CUDA is not available here — use device=cpu or device=auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"device={spec}: only {torch.cuda.device_count()} CUDA device(s) here — pick one of 0..{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise UserError(f"device='{spec}' is not supported — use auto, cpu, cuda or cuda:N")
    return device


def resolve_precision(spec: str, device: torch.device) -> str:
    """auto -> bf16 on CUDA (fp16 where bf16 is unsupported), fp32 on CPU."""
    if spec == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if spec not in PRECISIONS:
        raise UserError(f"trainer.precision='{spec}' is not one of auto, {', '.join(PRECISIONS)}")
    return spec


def autocast_context(precision: str, device: torch.device):
    """A zero-argument factory of the autocast context for this precision (fp32: none)."""
    if precision == "fp32":
        return nullcontext
    return partial(torch.autocast, device_type=device.type, dtype=PRECISIONS[precision])


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak bf16 FLOP/s of the device, for MFU; None where unknown (CPU, unlisted GPU)."""
    if override:
        return float(override)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, flops in PEAK_BF16_FLOPS.items():
        if fragment in name:
            return flops
    return None


def enable_fast_matmul(device: torch.device) -> None:
    """TF32 for fp32 matmuls and convolutions on CUDA (Ampere and later): ~8x the fp32
    throughput for the parts autocast leaves in fp32, at a precision training does not notice."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def process_device(device: torch.device) -> torch.device:
    """Under torchrun or a submitit job of several tasks (WORLD_SIZE > 1) each process takes its own
    GPU, LOCAL_RANK among those it sees (modulo them: a scheduler that binds one GPU to each task
    shows each task its own as the only one); CPU stays CPU."""
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    return device


class DeviceSetup(NamedTuple):
    """Where and in what precision a command computes (unpacks as device, precision, autocast)."""

    device: torch.device
    precision: str                   # fp32 | bf16 | fp16, resolved from auto
    autocast: Callable               # zero-argument factory of the precision's autocast context


def setup_device(device: str, precision: str) -> DeviceSetup:
    """The device setup of `posenc train`, `eval`, `probe` and `bench`: ``device`` (auto | cpu |
    cuda | cuda:N; under torchrun this process's GPU), ``precision`` (auto | fp32 | bf16 | fp16)
    and its autocast, and fast (TF32) fp32 matmuls on CUDA."""
    where = process_device(resolve_device(device))
    resolved = resolve_precision(precision, where)
    enable_fast_matmul(where)
    return DeviceSetup(where, resolved, autocast_context(resolved, where))


def use_compile(setting, device: torch.device) -> bool:
    """trainer.compile: true | false | auto (on for CUDA, off for CPU)."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)


def machine_load() -> dict[str, float]:
    """The machine's 1-minute load average and the CPUs this process may use, for summary.json: a throughput timed while other processes competed for the
    CPUs (load above the CPU count) is noise, and the report says so. Empty where the OS has none."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows: no load average
        return {}
    return {MACHINE_LOAD.name: round(load, 2), MACHINE_CPUS.name: cpu_count()}


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: the thread count the process's first CPU training run chose (choose_cpu_threads), kept for the rest
_CHOSEN: int | None = None


def choose_cpu_threads(device: torch.device) -> int:
    """The torch threads a new training run on the CPU computes with, set and returned.

    ``OMP_NUM_THREADS`` decides where it is set (torchrun sets 1 for each of its ranks). Otherwise
    the cores other processes leave free, busy both by the 1-minute load average and now
    (``busy_cpus``) (at least one; shared among the node's ranks of a submitit job), at most torch's
    default of a thread per core. OpenMP's
    threads spin waiting for a core they do not get: on 2 CPUs at load 5 to 9, the default model
    trained at 1,600-2,000 tokens/s on 1 thread and 700-800 on 2, the tests' 1-layer model 20×
    faster on 1 (docs/running.md). Said in the log when it lowers the count. The count is part of a
    run (a resume keeps it: keep_cpu_threads), since the sums of a CPU step change in their last
    bits with it."""
    global _CHOSEN
    current = torch.get_num_threads()
    if device.type != "cpu" or os.environ.get("OMP_NUM_THREADS"):
        return current
    if _CHOSEN is not None:  # a sweep's later jobs (one process): the first job's count, not one the load
        torch.set_num_threads(_CHOSEN)  # of the earlier jobs (this process's own) would lower for them alone
        return _CHOSEN
    cpus, ranks = cpu_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): torch's default
        load = 0.0
    now = busy_cpus()
    # busy by both measures: the 1-minute average lags (a job that ended a minute ago, this process's
    # own start-up and pip's install before it: at load 0.9 on 2 idle CPUs the default model trained on
    # 1 thread at 3,100 tokens/s instead of 8,300), a moment's sample misses what only runs in bursts
    others = load if now is None else min(load, now)
    free = max(1, round(cpus - others))
    threads = min(current, max(1, free // ranks))
    _CHOSEN = threads
    if threads < current:
        torch.set_num_threads(threads)
        log.warning("other processes keep the CPUs busy (1-minute load %.1f, %s on %d CPUs): training on %d "
                    "torch thread%s, not %d, which would wait for busy cores — set OMP_NUM_THREADS to choose",
                    load, "busy now unknown" if now is None else f"{now:.1f} busy now", cpus, threads,
                    "s" if threads > 1 else "", current)
    return threads


def busy_cpus(seconds: float = 0.25) -> float | None:
    """How many of this process's CPUs (its affinity) were busy over the next ``seconds``, from Linux's
    /proc/stat (this process sleeps meanwhile, so the time is other processes'); None elsewhere."""
    try:
        mine = os.sched_getaffinity(0)
        before = _cpu_times(mine)
        time.sleep(seconds)
        after = _cpu_times(mine)
    except (AttributeError, OSError, ValueError):
        return None
    busy = 0.0
    for cpu, (total, idle) in after.items():
        elapsed = total - before.get(cpu, (total, idle))[0]
        if elapsed > 0:
            busy += 1.0 - (idle - before[cpu][1]) / elapsed
    return busy if after else None


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """cpu -> (all its time, its idle and iowait time), in clock ticks, for the CPUs named."""
    times = {}
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("cpu") and line[3].isdigit():
                name, *fields = line.split()
                if int(name[3:]) in cpus:
                    ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
                    times[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])
    return times


def keep_cpu_threads(threads: int | None, device: torch.device) -> None:
    """A resumed CPU run computes on the thread count it started with (unless OMP_NUM_THREADS says
    otherwise): a resume continues the same run, to the last bit."""
    if threads and device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(threads))
