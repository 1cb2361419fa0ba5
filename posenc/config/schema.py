"""The typed schema of posenc's configuration.

The YAML files under conf/ are the user's interface; the dataclasses below are their schema
(types only: the values live in the YAML, once). ``PosencConfig`` is registered in Hydra's
ConfigStore as ``posenc_schema`` and named first in conf/config.yaml's defaults list, so every
YAML (ours, an experiment's, a user's from ``--config-dir``) and every override is merged onto
typed nodes: a wrong type or an unknown key is OmegaConf's own error, raised while composing
(cli/explain.py makes it one line). The groups whose keys depend on the choice (encoding,
dataset, tokenizer) are typed by the ``__init__`` of the class ``_target_`` names
(choice_schema, posenc/config/choices.py), so a new encoding is still one module plus one YAML.
What types cannot say (positive sizes, d_model % n_head) is the RULES table of validate
(posenc/config/rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

SCHEMA_NAME = "posenc_schema"


@dataclass
class TrainerConfig:
    seq_len: int = MISSING
    batch_size: int = MISSING
    grad_accum: int = MISSING
    max_steps: int = MISSING
    lr: float = MISSING
    min_lr_ratio: float = MISSING
    warmup_steps: int = MISSING
    weight_decay: float = MISSING
    beta1: float = MISSING
    beta2: float = MISSING
    grad_clip: float = MISSING
    log_interval: int = MISSING
    eval_interval: int = MISSING
    eval_batches: int = MISSING
    early_evals: int = MISSING                  # evaluations per eval_interval over the first 2·eval_interval steps
    checkpoint_interval: int = MISSING
    checkpoint: str = MISSING                   # last | best | none: what the run keeps (train/checkpoint.py)
    precision: str = MISSING                    # auto | bf16 | fp16 | fp32
    compile: Any = MISSING                      # auto | true | false
    peak_flops: Optional[float] = MISSING
    resume: Any = MISSING                       # false | <run dir> | auto | true
    init_from: Optional[str] = MISSING          # null | <run dir>: start from that run's weights (train/init_from.py)
    convergence_targets: List[float] = MISSING
    # resume a run whose encoding code changed since it started (posenc/record/provenance.py); a default
    # here so run directories written before the key load
    allow_code_change: bool = False
    # resume on another number of processes or at another global batch (train/checkpoint.py check_world),
    # recorded in the run; a default here so run directories written before the key load
    resume_reshape: bool = False


@dataclass
class ModelConfig:
    _target_: str = MISSING
    n_layer: int = MISSING
    n_head: int = MISSING
    d_model: int = MISSING
    dropout: float = MISSING
    attention: str = MISSING                    # softmax | linear
    flavor: str = MISSING                       # gpt2 | llama (posenc/nn/flavors.py)
    # one component of the flavour switched (null: the flavour's own), for recipe ablations;
    # defaults here so run directories written before these keys load as their flavour
    norm: Optional[str] = None                  # layernorm | rmsnorm
    mlp: Optional[str] = None                   # gelu | swiglu
    bias: Optional[bool] = None                 # biases in every linear and LayerNorm
    tie_embeddings: Optional[bool] = None       # output head = token embedding
    init: Optional[str] = None                  # gpt2 | fan_in


@dataclass
class LayerKindConfig:
    window: Optional[int] = None                # tokens a query sees, itself included; null: its whole causal past
    chunked: bool = False                       # chunks of `window` tokens (Llama 4) instead of a sliding band (Mistral)
    mixer: str = "softmax"                      # softmax | gated_delta | kda | gla: attention or a gated linear recurrence (posenc/nn/recurrent.py)
    encoding: Dict[str, Any] = field(default_factory=dict)   # this kind's encoding: overrides of `encoding`, or a whole one with _target_


@dataclass
class LayoutConfig:
    name: str = MISSING
    window: Optional[int] = None                # the local window the presets' kinds refer to (${layout.window})
    pattern: List[str] = MISSING                # layer kinds, repeated over model.n_layer, anchored at the last layer
    kinds: Dict[str, LayerKindConfig] = MISSING


@dataclass
class EvalConfig:
    lengths: List[float] = MISSING              # multiples of trainer.seq_len (OmegaConf 2.3 iterates a List[Union] as nodes)
    stride: Optional[int] = MISSING
    packing: Optional[str] = None               # null: as dataset.packing | concat | bos_aligned | documents
    tokens: int = MISSING
    batch_tokens: int = MISSING
    at_end: bool = MISSING
    per_position: bool = MISSING                # the per-position loss pass (per_position*.json / .png)


@dataclass
class LoggerConfig:
    name: str = MISSING                         # wandb | none
    # W&B's keys; logger=none leaves them unused, so they have defaults here
    mode: str = "offline"
    project: str = "posenc"
    entity: Optional[str] = None
    group: Optional[str] = None
    job_type: str = "train"
    tags: List[str] = field(default_factory=list)
    log_checkpoint: bool = False                # the final checkpoint as a W&B model artifact


@dataclass
class BenchConfig:
    encodings: Optional[List[str]] = MISSING
    steps: int = MISSING
    warmup: int = MISSING
    rounds: int = MISSING
    batch_size: int = MISSING
    seq_len: int = MISSING
    peak_flops: Optional[float] = MISSING
    reference: bool = MISSING
    eval_length_multiple: int = MISSING
    document_length: Optional[int] = None       # N: every window packs documents of N tokens (documents masking)
    decode: bool = False                        # also what decoding costs (posenc/bench/decode.py)
    decode_contexts: List[int] = field(default_factory=lambda: [1, 4, 16])  # × seq_len, the contexts decoded at
    decode_steps: int = 8                       # tokens decoded one at a time per round and context


@dataclass
class BudgetConfig:
    """conf/budget/x<f>.yaml: trainer.max_steps = steps · factor (the same batch, so f× the tokens)."""
    steps: int = MISSING                        # the ×1 budget in optimiser steps (an experiment sets it)
    factor: float = MISSING                     # 1, 2, 4: the multiple of it this run trains


@dataclass
class PosencConfig:
    seed: int = MISSING
    device: str = MISSING                       # auto | cpu | cuda | cuda:N
    name: Optional[str] = MISSING               # a sweep's name: its directory and W&B group (null: the swept keys)
    # look up (or measure once) `posenc check`'s verdict on the encoding and record it (posenc/check/verdict.py);
    # a default here so run directories written before the key load
    check: bool = True
    # typed per choice by choice_schema (from the _target_ class's __init__)
    encoding: Dict[str, Any] = MISSING
    model: ModelConfig = MISSING
    layout: LayoutConfig = MISSING              # local/global layers: posenc/nn/layout.py
    dataset: Dict[str, Any] = MISSING
    tokenizer: Dict[str, Any] = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = MISSING
    bench: Optional[BenchConfig] = None         # only `posenc bench` composes it
    budget: Optional[BudgetConfig] = None       # only budget=x<f> composes it (conf/budget/)


ConfigStore.instance().store(name=SCHEMA_NAME, node=PosencConfig)


def steps_times(steps: int, factor: float) -> int:
    """${posenc.times:${budget.steps},${budget.factor}}: a budget's optimiser steps."""
    return int(round(int(steps) * float(factor)))


OmegaConf.register_new_resolver("posenc.times", steps_times, replace=True)
