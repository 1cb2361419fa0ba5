"""A checked encoding survives posenc's own checkpoints: its state goes through safetensors
unchanged (posenc/record/statefile.py), and a run resumed from a checkpoint continues bit for bit as
the run that never stopped (posenc/train/checkpoint.py, the TrainState and train_step of
posenc/train/state.py: the code `posenc train` runs, not a copy)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from posenc.check.results import CheckResult, holds
from posenc.check.subject import VOCAB, Subject
from posenc.data.windows import RandomWindows
from posenc.record.statefile import load_state, save_state
from posenc.train.checkpoint import (
    resume_training,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from posenc.train.state import TrainState, new_train_state, train_step

STEPS = 2  # optimizer steps before the checkpoint, and again after it


def round_trip(s: Subject) -> list[CheckResult]:
    """Every tensor of the state dict comes back equal, and a fresh model loading it computes the
    same logits bit for bit."""
    model = s.model()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.safetensors"
        save_state({"model": model.state_dict()}, path)
        loaded = load_state(path)["model"]
    original = model.state_dict()
    differ = sorted(k for k in original if k not in loaded or not torch.equal(original[k], loaded[k]))
    differ += sorted(set(loaded) - set(original))
    fresh = s.model(seed=1)
    fresh.load_state_dict(loaded)
    x = s.tokens()
    with torch.no_grad():
        same = torch.equal(model(x)[0], fresh(x)[0])
    measured = f"{len(original)} tensors" + (", same logits" if same else "")
    unsaved = unsaved_buffers(s) if not same else []
    note = (f"{', '.join(differ[:3])} changed through safetensors" if differ else
            f"a model loading the state computes other logits: {unsaved_note(unsaved)}" if unsaved else
            "a model loading the state computes other logits, though every tensor of the state came back equal and no "
            "buffer outside it differs: the forward reads something else that differs between builds")
    return [holds("safetensors round trip", not differ and same, measured, note)]


def unsaved_buffers(s: Subject) -> list[str]:
    """The buffers that differ between two fresh builds of the model (seeds 0 and 1, no forward run: a
    cache derived from them is still empty) and that the state dict does not hold (registered with
    persistent=False): what no checkpoint restores."""
    a, b = s.model(seed=0), s.model(seed=1)
    saved, other = set(a.state_dict()), dict(b.named_buffers())
    return sorted(name for name, buf in a.named_buffers() if name not in saved and name in other
                  and (buf.shape != other[name].shape or not torch.equal(buf, other[name])))


def unsaved_note(names: list[str]) -> str:
    """What a buffer that no checkpoint holds and that differs between builds means."""
    return (f"{', '.join(names[:3])} {'differs' if len(names) == 1 else 'differ'} between two builds of the model and "
            f"{'is' if len(names) == 1 else 'are'} not in the state dict (persistent=False), so no checkpoint restores "
            f"{'it' if len(names) == 1 else 'them'} — compute {'it' if len(names) == 1 else 'them'} from the config "
            f"alone (no unseeded random numbers), or register {'it' if len(names) == 1 else 'them'} persistent")


def training_config(s: Subject) -> DictConfig:
    """The subject's config with a short, uncompiled schedule of 2·STEPS steps of batch 2."""
    return s.with_changes(**{"trainer.compile": False, "trainer.grad_accum": 1, "trainer.batch_size": 2,
                             "trainer.max_steps": 2 * STEPS, "trainer.warmup_steps": 1})


def train_state(s: Subject, cfg: DictConfig, seed: int) -> TrainState:
    """A TrainState on CPU in float32 (as training builds it), over random tokens drawn by seed."""
    tokens = np.random.default_rng(0).integers(0, VOCAB, 4096)
    batches = RandomWindows(tokens, s.T, batch_size=int(cfg.trainer.batch_size), seed=seed)
    model = s.model(seed=seed, dtype=torch.float32, visible=False, cfg=cfg).train()
    return new_train_state(model, cfg.trainer, batches, torch.device("cpu"), contextlib.nullcontext)


@contextlib.contextmanager
def quiet(logger: str) -> Iterator[None]:
    """The logger's INFO lines held back for the duration (warnings still pass)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)


def resume(s: Subject) -> list[CheckResult]:
    """STEPS steps, a checkpoint, STEPS more; against a differently seeded model resumed from that
    checkpoint and stepped STEPS times: the same losses and the same parameters, bit for bit."""
    saved_rng, cfg = rng_state(), training_config(s)
    try:
        straight = train_state(s, cfg, seed=0)
        for _ in range(STEPS):
            train_step(straight, [straight.batches.next()])
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(Path(tmp), straight, cfg, None)
            expected = [float(train_step(straight, [straight.batches.next()]).loss) for _ in range(STEPS)]
            resumed = train_state(s, cfg, seed=1)
            with quiet("posenc"):  # its "resumed at step …" line is the training log's, not the check's
                resume_training(Path(tmp), cfg, resumed)
        got = [float(train_step(resumed, [resumed.batches.next()]).loss) for _ in range(STEPS)]
    finally:
        set_rng_state(saved_rng)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    unsaved = unsaved_buffers(s) if got != expected or differ else []
    return [holds("resume is bit-exact", got == expected and not differ,
                  f"steps {STEPS + 1}–{2 * STEPS}, resumed = uninterrupted: losses {' '.join(f'{v:.4f}' for v in got)}",
                  f"resumed {got} vs uninterrupted {expected}"
                  + (f": {unsaved_note(unsaved)}" if unsaved else f"; {differ[0]} differs" if differ else ""))]
