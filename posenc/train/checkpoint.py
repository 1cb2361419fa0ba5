"""Checkpoints and exact resume.

``checkpoints/last.safetensors`` holds everything the training loop needs to continue as if it
had never stopped: model, optimizer, scheduler, the RNG states (torch, CUDA, numpy, python), the
data sampler's generator, step and tokens, the last validation metrics, the byte length of
metrics.jsonl at that step (rows written after it are dropped on resume, so no step is
logged twice), the W&B run id and the resolved config. Tensors are stored as safetensors and
the rest as JSON (posenc/record/statefile.py): opening a shared run directory cannot run code. It is
written to a temp file and renamed, so a crash mid-write leaves the previous good checkpoint.

``trainer.checkpoint`` says what a run keeps (Checkpoints):

- ``last`` (default): ``checkpoints/last.safetensors`` every ``trainer.checkpoint_interval`` steps, at the
  end and on SIGTERM / Ctrl-C. `posenc eval` reads it; resume continues from it.
- ``best``: ``checkpoints/best.safetensors``, saved at each evaluation that lowers val/loss (the
  same format, so `posenc eval` reads it). While the run is unfinished ``last.safetensors`` is kept
  too, so an interrupted run resumes exactly; it is deleted when the run completes, leaving the
  best alone (a completed ``best`` run cannot be extended).
- ``none``: nothing is saved; the run cannot be resumed or evaluated later.

The number of processes is part of a run: a checkpoint records it (``world_size``, ``per_node``)
with the global batch (windows per optimizer step), and a resume on another number of processes
or at another global batch is refused with the command that resumes it as it ran (``torchrun
--standalone --nproc_per_node=N -m posenc train trainer.resume=…``), unless
``trainer.resume_reshape=true`` asks for the change, which every later checkpoint and the summary
then carry (``reshapes``: at which step, from what, to what).
"""

from __future__ import annotations

import copy
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posenc.build import restore_weights
from posenc.errors import UserError
from posenc.eval import proof
from posenc.eval.loss import global_batch
from posenc.hardware import keep_cpu_threads
from posenc.record import provenance
from posenc.record.rundir import RunDir
from posenc.record.statefile import CHECKPOINT_VERSION, save_state
from posenc.train import distributed
from posenc.train.state import TrainState
from posenc.train.stop import GracefulStop, RunInterrupted, resume_command  # noqa: F401 - the loop's and CLI's

log = logging.getLogger("posenc")

#: config sections that must equal the checkpoint's for the weights and batches to make sense
MUST_MATCH = ("model", "encoding", "tokenizer", "dataset", "seed", "trainer.seq_len", "trainer.batch_size",
              "trainer.grad_accum")
#: what trainer.resume_reshape=true lets a resume change besides the number of processes: how the
#: global batch is made
RESHAPE_KEYS = ("trainer.batch_size", "trainer.grad_accum")
RESHAPE_KEY = "trainer.resume_reshape"


class TrainingDiverged(UserError, RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, state: TrainState, cfg: DictConfig, wandb_id: str | None,
                    val: dict | None = None, kind: str = "last", best_val_loss: float = math.inf,
                    reshapes: list[dict] | None = None, proofs: list[dict] | None = None,
                    probe: dict | None = None) -> Path:
    """checkpoints/<kind>.safetensors, written to a temp file and renamed: the last good one survives.
    probe: the model's outputs on the probe batch where already computed (eval/proof.py)."""
    run = RunDir(run_dir)
    path = run.checkpoint(kind)
    path.parent.mkdir(exist_ok=True)
    metrics = run.metrics_file
    saved = {
        "version": CHECKPOINT_VERSION,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "sampler": state.batches.state_dict(),
        "rng": rng_state(),
        "step": state.step,
        "tokens": state.tokens,
        "val": dict(val or {}),
        "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "wandb_id": wandb_id,
        "best_val_loss": best_val_loss,  # trainer.checkpoint=best: the val/loss best checkpoint holds, for resume
        # the processes it trained on and the windows per optimizer step: a resume must match them
        "world_size": distributed.world_size(),
        "per_node": distributed.requested_per_node() if distributed.active() else 1,
        "global_batch": global_batch(cfg.trainer, distributed.world_size()),
        "reshapes": list(reshapes or []),  # each resume that changed those (trainer.resume_reshape=true)
        "threads": torch.get_num_threads(),  # a CPU step's sums change in their last bits with it: a resume keeps it
        # the model's outputs on a fixed probe batch: whatever rebuilds the model from this file compares (eval/proof.py)
        proof.KEY: probe or proof.probe(state.model, int(cfg.trainer.seq_len)),
        "proofs": list(proofs or []),  # each rebuild of the run's model so far (a resume, an init_from parent) compared
    }
    save_state(saved, path)
    return path


def _select(container: dict, key: str):
    for part in key.split("."):
        if not isinstance(container, dict) or part not in container:
            return None
        container = container[part]
    return container


def check_compatible(state: dict, cfg: DictConfig, path: Path) -> None:
    """Refuse to resume a checkpoint whose model, data or batch shape differ from cfg's (the batch
    may change under trainer.resume_reshape=true: check_world)."""
    current = OmegaConf.to_container(cfg, resolve=True)
    reshape = bool(cfg.trainer.get("resume_reshape"))
    for key in MUST_MATCH:
        if reshape and key in RESHAPE_KEYS:
            continue
        was, now = _select(state["config"], key), _select(current, key)
        if was != now:
            raise UserError(f"checkpoint '{path}' was trained with {key}={was}, but this run has {key}={now} — "
                            f"resume with the run's own settings, or start a new run")


def check_world(saved: dict, run_dir: Path, world_size: int, batch: int | None = None,
                reshape: bool = False) -> dict | None:
    """A resume on world_size processes at ``batch`` windows per optimizer step (None: not known
    yet, the CLI's check before composing) of a run whose checkpoint header is ``saved``. The same:
    None. Otherwise refused, with the command that resumes the run as it ran, unless ``reshape``
    (trainer.resume_reshape=true): then the record of the change, for ``reshapes``. A checkpoint
    from before world sizes were recorded is not checked."""
    was = saved.get("world_size")
    if was is None:
        return None
    was_batch = saved.get("global_batch")
    if was == world_size and (batch is None or batch == was_batch):
        return None
    if not reshape:
        procs = lambda n: f"{n} process{'es' if n != 1 else ''}"  # noqa: E731
        now = procs(world_size) + (f" at a global batch of {batch}" if batch is not None and batch != was_batch else "")
        raise UserError(f"trainer.resume: {run_dir} trained on {procs(was)} at a global batch of {was_batch} windows, "
                        f"this resume runs {now} — resume it as it ran: "
                        f"`{resume_command(run_dir, was, saved.get('per_node'))}`, or add "
                        f"{RESHAPE_KEY}=true to change it (recorded in the run)")
    return {"step": saved["step"], "tokens": saved["tokens"], "from": {"world_size": was, "global_batch": was_batch},
            "to": {"world_size": world_size, "global_batch": batch}}


def truncate_metrics(run_dir: Path, size: int) -> None:
    """Drop metrics.jsonl rows written after the checkpoint: they will be logged again."""
    metrics = RunDir(run_dir).metrics_file
    if metrics.exists() and metrics.stat().st_size > size:
        with open(metrics, "r+b") as f:
            f.truncate(size)


@dataclass
class Resumed:
    """What the loop continues from besides the TrainState: last validation metrics, the W&B id."""

    val: dict = field(default_factory=dict)
    wandb_id: str | None = None
    best_val_loss: float = math.inf
    reshapes: list[dict] = field(default_factory=list)  # changes of world size or global batch (check_world)
    proofs: list[dict] = field(default_factory=list)  # each rebuild of the model compared with its checkpoint (eval/proof.py)


def resume_training(run_dir: Path, cfg: DictConfig, state: TrainState, say: bool = False) -> Resumed:
    """Restore every piece of the TrainState (in place) and the RNGs from run_dir's checkpoint,
    for an exact resume (on a CPU, the torch threads the run started with too). The resumed model is
    compared with the checkpoint's probe batch (``proofs``, eval/proof.py); say: print its warning
    where it does not reproduce it (a training run; `posenc check`'s resume row keeps the record)."""
    run = RunDir(run_dir)
    path = run.checkpoint()
    saved = run.load_checkpoint("last")
    check_compatible(saved, cfg, path)
    world = distributed.world_size()
    reshaped = check_world(saved, run_dir, world, global_batch(cfg.trainer, world),
                           reshape=bool(cfg.trainer.get("resume_reshape")))
    reshapes = [*saved.get("reshapes", []), *([reshaped] if reshaped else [])]
    if reshaped:
        log.warning("resumed on %d process(es) at a global batch of %d windows; it trained on %d at %d until step %d "
                    "(%s=true): recorded in the checkpoint and the run's summary (reshapes)", world, reshaped["to"]["global_batch"],
                    reshaped["from"]["world_size"], reshaped["from"]["global_batch"], saved["step"], RESHAPE_KEY)
    restore_weights(state.model, saved, path)
    proved = prove_resumed(state.model, saved, run, cfg)
    if say:
        proof.say(proved)
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.batches.load_state_dict(saved["sampler"])
    state.step, state.tokens = saved["step"], saved["tokens"]
    set_rng_state(saved["rng"])
    keep_cpu_threads(saved.get("threads"), state.device)
    truncate_metrics(run_dir, saved.get("metrics_bytes", 0))
    log.info("resumed at step %d (%s tokens) from %s", state.step, f"{state.tokens:,}", path)
    return Resumed(dict(saved.get("val") or {}), saved.get("wandb_id"), saved.get("best_val_loss", math.inf), reshapes,
                   [*saved.get("proofs", []), proved])


def prove_resumed(model: torch.nn.Module, saved: dict, run: RunDir, cfg: DictConfig) -> dict:
    """The resumed model (built by this process, the checkpoint's weights loaded) against the probe its
    checkpoint holds (eval/proof.py): the record for the summary."""
    vocab = model.lm_head.out_features
    return {**proof.verify(model, saved, str(run.checkpoint().relative_to(run.path)),
                           lambda: provenance.changes(run), lambda: proof.rebuild(cfg, vocab)),
            "at": f"resume at step {saved['step']}"}


class Checkpoints:
    """What trainer.checkpoint keeps (last | best | none; see the module docstring)."""

    def __init__(self, run_dir: Path, kind: str, best_val_loss: float = math.inf,
                 reshapes: list[dict] | None = None, proofs: list[dict] | None = None) -> None:
        self.run_dir, self.kind, self.best_val_loss = Path(run_dir), kind, best_val_loss
        self.reshapes = list(reshapes or [])  # carried by every checkpoint (check_world)
        self.proofs = list(proofs or [])  # carried by every checkpoint: each rebuild of the model compared
        self.probe: dict | None = None  # the last checkpoint's probe (eval/proof.py), its weights the model's since
    def evaluated(self, state: TrainState, cfg: DictConfig, wandb_id: str | None, val: dict) -> None:
        """After an evaluation: checkpoints/best.safetensors when val/loss is the lowest yet (kind best)."""
        loss = val.get("val/loss")
        if self.kind == "best" and loss is not None and loss < self.best_val_loss:
            self.best_val_loss = loss
            save_checkpoint(self.run_dir, state, cfg, wandb_id, val, "best", loss, self.reshapes, self.proofs)

    def save(self, state: TrainState, cfg: DictConfig, wandb_id: str | None, val: dict) -> None:
        """At a checkpoint step or a stop: checkpoints/last.safetensors, what resume continues from (kinds last, best)."""
        if self.kind != "none":
            self.probe = proof.probe(state.model, int(cfg.trainer.seq_len))
            save_checkpoint(self.run_dir, state, cfg, wandb_id, val, "last", self.best_val_loss, self.reshapes,
                            self.proofs, self.probe)

    def prove(self, cfg: DictConfig, state: TrainState) -> list[dict]:
        """At the end of a run: the checkpoint `posenc eval` will read (the best where kept, else the
        last, saved at this last step from the model as it is now) loaded into a model built afresh as
        the run's config and seed make it, against the probe batch it holds; one warning where it does
        not reproduce it. Every proof of the run, for the summary."""
        run = RunDir(self.run_dir)
        if self.kind == "none" or self.probe is None and self.kind == "last":
            return self.proofs
        if self.kind == "best":
            saved = run.load_checkpoint("best")
        else:  # the last checkpoint holds the model's weights as they are now: not read back
            saved = {"model": state.model.state_dict(), proof.KEY: self.probe, "step": state.step}
        vocab = state.model.lm_head.out_features
        with proof.kept_rng():
            model = proof.rebuild(cfg, vocab)
        model.kernels = copy.deepcopy(state.model.kernels)  # the kernels the run ended on: no failed compile again
        path = run.checkpoint(self.kind)
        restore_weights(model, saved, path)
        record = proof.verify(model.to(state.device), saved, str(path.relative_to(run.path)), lambda: [],
                              lambda: proof.rebuild(cfg, vocab))
        proof.say(record)
        return [*self.proofs, {**record, "at": f"end of training, step {saved['step']}"}]

    def finish(self) -> dict:
        """At the end of a completed run: drop the last checkpoint if only the best is kept; return what is
        kept, for summary.json: kind, paths (relative to the run dir), bytes, MB."""
        run = RunDir(self.run_dir)
        if self.kind == "best":
            run.checkpoint().unlink(missing_ok=True)
        kept = [p for p in (run.checkpoint("best"), run.checkpoint()) if p.is_file()]
        size = sum(p.stat().st_size for p in kept)
        return {"kind": self.kind, "paths": [str(p.relative_to(self.run_dir)) for p in kept],
                "bytes": size, "mb": round(size / 2**20, 2)}


def check_finite(loss: torch.Tensor | float, step: int, run_dir: Path) -> float:
    """The step's loss as a float; NaN or inf stops the run, naming the step."""
    value = float(loss)
    if not math.isfinite(value):
        kept = RunDir(run_dir).checkpoint()
        where = f"the last good checkpoint is kept in {kept}" if kept.exists() else "no checkpoint was saved yet"
        raise TrainingDiverged(f"loss is {value} at step {step}; {where} — lower trainer.lr or raise "
                               f"trainer.warmup_steps, then start again")
    return value
