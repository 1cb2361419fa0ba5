"""A checkpoint that proves its model: the model's output on a fixed probe batch, saved with every
checkpoint and recomputed by each command that rebuilds the model from it.

A model's weights are not all that computes its logits. A buffer registered with
``persistent=False`` (RoPE's cos/sin cache, ALiBi's slopes) is not in the state dict: the
constructor makes it again in every process. Where the constructor draws it from a generator the
run's seed does not reach, or from code that changed since training, the rebuilt model computes
other logits than the one that trained, and every number measured from the checkpoint (``posenc
eval``, ``probe``, a resume's later steps, an ``init_from`` child's start) is about another model.

So each checkpoint holds ``proof`` (``train/checkpoint.py``): ``PROBE_SEQUENCES`` sequences of
``min(seq_len, PROBE_LEN)`` tokens drawn by a generator seeded ``PROBE_SEED`` over the vocabulary,
the log-probability the model gives each next token (``(B, T - 1)``) and its full logits at each
sequence's last position (``(B, V)``: the whole window behind it): 2·63 + 2·V floats, 3 KB in the
file at a byte vocabulary, 395 KB at GPT-2's 50,257 tokens. They are computed in evaluation mode, in float32
(no autocast, no TF32 on CUDA), without gradients, leaving the RNGs and the run's kernel record as
they were. ``posenc eval`` and ``probe``, a resume and an ``init_from`` child rebuild the model and
compute them again (``verify``).

**Tolerance** (``Tolerance``), derived for float32, the dtype the probe computes in. Two equal
models differ only in how their sums are ordered (a thread count, a kernel, a device): reordering a
sum of K products moves it by about √K·u of its scale (u = 2⁻²⁴, float32's unit roundoff; Higham &
Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019), and the
model is ``n_layer + 1`` such stages (its blocks, then the head) whose errors add along the residual
stream. So the logits may differ by ``(n_layer + 1)·√K·u`` of their largest magnitude, K the longest
sum (a linear layer's input width, or the window's keys), and a log-probability by twice that plus
the log-sum-exp's own √V·u. Measured on a CPU (docs/running.md): ``model=base`` (GPT-2 small's shape:
12 layers, d = 768, 50,257 tokens) on 1 and on 2 threads moved its logits by 1.1e-6 of their scale,
against 3.5e-5 allowed; two processes on one thread count agreed bit for bit.

**Beyond it**, one ``warning:`` line names what differs, in this order: the code (the run's
provenance, posenc/record/provenance.py: which definitions changed since training); else a
non-persistent buffer that differs between two fresh builds of the model (it is not saved, and not
reproducible); else ``unknown``. A checkpoint from before probes were saved cannot prove anything:
said once, never a failure.
"""

from __future__ import annotations

import copy
import math
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from posenc.build import build_model, restore_weights, seed_everything
from posenc.errors import PosencWarning
from posenc.record.proofs import RECORD as RECORD_KEY  # noqa: F401 - where a command's record keeps it

#: where a checkpoint keeps the probe
KEY = "proof"
PROBE_SEQUENCES = 2
PROBE_LEN = 64
PROBE_SEED = 0
#: float32's unit roundoff: half the distance from 1 to the next float
UNIT_ROUNDOFF = torch.finfo(torch.float32).eps / 2


def probe_tokens(vocab_size: int, seq_len: int) -> Tensor:
    """The probe batch: (PROBE_SEQUENCES, min(seq_len, PROBE_LEN)) token ids, the same for every run
    of that vocabulary and length."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    return torch.randint(0, vocab_size, (PROBE_SEQUENCES, min(int(seq_len), PROBE_LEN)), generator=generator)


@contextmanager
def kept_rng() -> Iterator[None]:
    """Python's, numpy's and torch's (CPU and CUDA) random states as they were before the block: a probe
    or a rebuild between two training steps changes nothing a resume must reproduce."""
    python, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy_state)


@contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """float32 as it is written: no autocast, and on CUDA no TF32 (which rounds a matmul's inputs to
    10 bits); the process's settings restored after."""
    if device.type != "cuda":
        with torch.autocast(device.type, enabled=False):
            yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.autocast(device.type, enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
        torch.set_float32_matmul_precision(precision)


@torch.no_grad()
def outputs(model: nn.Module, tokens: Tensor) -> dict[str, Tensor]:
    """The model's log-probability of each next token (B, T-1) and its logits at each sequence's last
    position (B, V), float32 on the CPU: in evaluation mode, exact float32, the RNGs and the model's
    kernel record (``GPT.kernels``, what the run writes) as they were, its mode restored. A kernel
    that falls back in the probe's forward says nothing: the run, or the command, says its own."""
    device = next(model.parameters()).device
    kernels = getattr(model, "kernels", None)
    was_training = model.training
    model.eval()
    if kernels is not None:  # the probe's own path is no path of the run's
        model.kernels = copy.deepcopy(kernels)
    try:
        with kept_rng(), exact_float32(device), warnings.catch_warnings():
            warnings.simplefilter("ignore", PosencWarning)
            logits = model(tokens.to(device))[0].float()  # (B, T, V)
    finally:
        model.train(was_training)
        if kernels is not None:
            model.kernels = kernels
    logprob = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, tokens.to(device)[:, 1:, None])[..., 0]
    return {"logprob": logprob.cpu(), "logits": logits[:, -1].cpu()}


def longest_sum(model: nn.Module, length: int) -> int:
    """K: the most products one output of the model sums: a linear layer's input width, or the
    window's keys in attention."""
    widths = [m.in_features for m in model.modules() if isinstance(m, nn.Linear)]
    return max([length, *widths])


def depth(model: nn.Module) -> int:
    """The model's stages whose rounding errors add up: its blocks and the head."""
    return int(getattr(model, "n_layer", 1)) + 1


def probe(model: nn.Module, seq_len: int) -> dict:
    """What a checkpoint keeps as ``proof``: the probe batch, the model's outputs on it, and what
    its tolerance is derived from (the longest sum K and the stages)."""
    tokens = probe_tokens(model.lm_head.out_features, seq_len)
    return {"tokens": tokens, **outputs(model, tokens), "longest_sum": longest_sum(model, tokens.shape[1]),
            "stages": depth(model), "device": str(next(model.parameters()).device.type)}


@dataclass(frozen=True)
class Tolerance:
    """How far float32 reassociation can move the probe's outputs (module doc): logits by ``logits``,
    log-probabilities by ``logprob``, both absolute, from the saved logits' largest magnitude."""

    relative: float
    logits: float
    logprob: float

    @classmethod
    def of(cls, saved: dict) -> Tolerance:
        relative = int(saved["stages"]) * math.sqrt(int(saved["longest_sum"])) * UNIT_ROUNDOFF
        scale = float(saved["logits"].abs().max())
        vocab = saved["logits"].shape[-1]
        logits = relative * scale
        return cls(relative, logits, 2 * logits + math.sqrt(vocab) * UNIT_ROUNDOFF)


def compare(saved: dict, now: dict[str, Tensor]) -> dict:
    """The checkpoint's probe against the rebuilt model's: the largest differences, the tolerance,
    and whether they are within it."""
    tolerance = Tolerance.of(saved)
    logprob = float((now["logprob"] - saved["logprob"].float()).abs().max())
    logits = float((now["logits"] - saved["logits"].float()).abs().max())
    mean = float((now["logprob"] - saved["logprob"].float()).mean())
    holds = logprob <= tolerance.logprob and logits <= tolerance.logits
    return {"holds": holds, "logprob_max_diff": logprob, "logit_max_diff": logits,
            "mean_logprob_diff": mean,  # nats per token: how far the rebuilt model's log-perplexity moves, with sign
            "tolerance": {"relative": tolerance.relative, "logits": tolerance.logits, "logprob": tolerance.logprob}}


def rebuild(cfg: DictConfig, vocab_size: int) -> nn.Module:
    """The model as training builds it, on the CPU: the run's seed set, then the model (its encoding
    first, as training's ``check_encodable`` builds it before any data is read)."""
    seed_everything(cfg.seed)
    return build_model(cfg, vocab_size)


#: what decides the model a config builds: a config that differs on one of these builds another model
MODEL_KEYS = ("model", "encoding", "layout", "trainer.seq_len")


def builds_same(a: DictConfig, b: DictConfig) -> bool:
    """Whether two configs build the same model (``encoding.scaling=yarn`` given to eval does not)."""
    return all(OmegaConf.select(a, key) == OmegaConf.select(b, key) for key in MODEL_KEYS)


def prove(model: nn.Module, state: dict, checkpoint: str, run_cfg: DictConfig, cfg: DictConfig,
          code_changes: Callable[[], list[str]]) -> dict:
    """``verify`` the checkpoint ``state`` (at path ``checkpoint``) of a run trained as ``run_cfg``, whose
    weights ``model`` (built from ``cfg``) holds: on ``model`` itself where cfg builds the run's model,
    else on the run's own model built for it (an evaluation with another scaling, a fine-tune's child)."""
    vocab = model.lm_head.out_features
    if not builds_same(run_cfg, cfg):
        device = next(model.parameters()).device
        with kept_rng():
            model = rebuild(run_cfg, vocab)
        restore_weights(model, state, checkpoint)
        model = model.to(device)
    return verify(model, state, checkpoint, code_changes, lambda: rebuild(run_cfg, vocab))


def unsaved_buffers(model: nn.Module) -> dict[str, Tensor]:
    """The model's buffers the state dict leaves out (registered with persistent=False)."""
    saved = model.state_dict().keys()
    return {name: buffer for name, buffer in model.named_buffers() if name not in saved}


def buffers_that_differ(build: Callable[[], nn.Module]) -> list[str]:
    """The non-persistent buffers two builds of the same model disagree on (shape or values): what a
    checkpoint cannot carry and a rebuild does not reproduce."""
    with kept_rng():
        first, second = unsaved_buffers(build()), unsaved_buffers(build())
    return [name for name in first if name not in second or first[name].shape != second[name].shape
            or not torch.equal(first[name], second[name])]


def cause(code_changes: list[str], build: Callable[[], nn.Module] | None, devices: tuple[str, str] = ("", "")) -> str:
    """What differs: the code since training, else the buffers two builds disagree on, else unknown
    (devices: where the probe was computed, and where now, named where they differ)."""
    if code_changes:
        return f"the code changed since training ({'; '.join(code_changes)})"
    differ = buffers_that_differ(build) if build is not None else []
    if differ:
        return (f"the non-persistent buffer{'s' if len(differ) > 1 else ''} {', '.join(differ)} "
                f"differ{'' if len(differ) > 1 else 's'} between two builds of the model and "
                f"{'are' if len(differ) > 1 else 'is'} not in the checkpoint")
    if devices[0] and devices[0] != devices[1]:
        return (f"unknown (the code is the run's and two builds agree; the probe was computed on {devices[0]} and this "
                f"rebuild runs on {devices[1]}, whose kernels may sum in another order)")
    return "unknown (the code is the run's, and two builds of the model agree)"


def verify(model: nn.Module, state: dict, checkpoint: str, code_changes: Callable[[], list[str]],
           build: Callable[[], nn.Module] | None) -> dict:
    """The record of rebuilding ``model`` (weights loaded from ``state``, the checkpoint at path
    ``checkpoint``): ``holds`` True or False with the differences and, where False, the ``cause``;
    None where the checkpoint holds no probe (saved before probes were). build: a fresh build of the
    model as the run's config and seed make it, for naming a buffer."""
    saved = state.get(KEY)
    if not saved or saved.get("logprob") is None:
        return {"checkpoint": checkpoint, "holds": None,
                "cause": "cannot prove: the checkpoint was saved before checkpoints held a probe batch"}
    record = {"checkpoint": checkpoint, **compare(saved, outputs(model, saved["tokens"]))}
    if not record["holds"]:
        here = next(model.parameters()).device.type
        record["cause"] = cause(code_changes(), build, (str(saved.get("device") or ""), here))
    return record


def warning(record: dict) -> str | None:
    """The one line a failed proof prints (None where it held); "cannot prove" for an old checkpoint."""
    if record.get("holds") is None:
        return f"{record['checkpoint']}: {record['cause']}; its model cannot be proved to be the one that trained"
    if record["holds"]:
        return None
    return (f"{record['checkpoint']} does not reproduce the logits it was saved with (log-probabilities differ by up "
            f"to {record['logprob_max_diff']:.3g} nats, {record['tolerance']['logprob']:.2g} allowed by float32): "
            f"{record['cause']} — numbers measured from it are not the trained model's")


def say(record: dict, line: Callable[[str], None] | None = None) -> None:
    """The record's one line, where it has one: through ``line`` (a command's console, given "warning: …"),
    else as a PosencWarning, which the CLI prints as that line (training: a resume, an init_from child)."""
    message = warning(record)
    if message is None:
        return
    if line is not None:
        line(f"warning: {message}")
        return
    # no registry: Python's once-per-location would silence the next run's line in the same process
    warnings.warn_explicit(message, PosencWarning, __file__, 0, registry=None)
