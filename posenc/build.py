"""Config -> data, encoding, model: the only place that instantiates them.

Training, `posenc eval` and `posenc bench` all build through here, so a run, its evaluation
and its benchmark are the same model. ``hydra.utils.instantiate`` with each group's
``_target_`` is the registry; a constructor's ValueError/TypeError (an odd RoPE head dim, a
learned table shorter than the sequence) becomes one UserError naming the group.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from posenc.data.packing import TokenData, load_tokens
from posenc.data.synthetic import SyntheticTask
from posenc.errors import UserError
from posenc.nn.encodings.base import PositionalEncoding, PositionOutOfRange
from posenc.nn.model import GPT

log = logging.getLogger("posenc")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def instantiate_group(node: DictConfig, group: str, **kwargs):
    """Hydra instantiate, with a bad value reported as a user error naming the group."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError)):
            raise UserError(f"{group}: {cause}") from None
        raise


def build_tokenizer(cfg: DictConfig):
    return instantiate_group(cfg.tokenizer, "tokenizer")


def build_data(cfg: DictConfig) -> TokenData | SyntheticTask:
    """A corpus tokenized and packed (cached on disk), or, for dataset=synthetic, the task whose
    instances training and evaluation generate from the seed (byte values: no tokenizer)."""
    corpus = instantiate_group(cfg.dataset, "dataset")
    if isinstance(corpus, SyntheticTask):
        if cfg.tokenizer.name != "byte":
            raise UserError(f"dataset=synthetic writes byte values; tokenizer={cfg.tokenizer.name} does not apply "
                            f"— use tokenizer=byte")
        return corpus
    return load_tokens(corpus, build_tokenizer(cfg), log=log.info)


def build_encoding(cfg: DictConfig) -> PositionalEncoding:
    return instantiate_group(cfg.encoding, "encoding", d_model=cfg.model.d_model, n_head=cfg.model.n_head)


def build_model(cfg: DictConfig, vocab_size: int) -> GPT:
    encoding = build_encoding(cfg)
    return instantiate_group(cfg.model, "model", vocab_size=vocab_size, encoding=encoding)


def check_encodable(cfg: DictConfig) -> None:
    """The encoding's own rules (odd RoPE head dim, seq_len beyond learned max_len), checked
    before any data is read."""
    try:
        build_encoding(cfg).check_length(cfg.trainer.seq_len)
    except PositionOutOfRange as e:
        raise UserError(str(e)) from None


def encoding_summary(encoding: PositionalEncoding) -> dict:
    """The encoding's name and options, as summaries and tables show them."""
    return {"name": encoding.name, **encoding.options()}


def restore_weights(model: torch.nn.Module, state: dict, path: Path | str) -> None:
    """Load a checkpoint's weights into model; a shape or key mismatch is a UserError."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise UserError(f"checkpoint '{path}' does not fit this model ({first}) — "
                        f"use the model/encoding settings it was trained with") from None
