"""Config -> data, encoding, model: the only place that instantiates them.

Training, `posenc eval` and `posenc bench` all build through here, so a run, its evaluation
and its benchmark are the same model. ``hydra.utils.instantiate`` with each group's
``_target_`` is the registry; a constructor's ValueError/TypeError (an odd RoPE head dim, a
learned table shorter than the sequence) becomes one UserError naming the group.
"""

from __future__ import annotations

import inspect
import logging
import random
from pathlib import Path

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from posenc.data.packing import TokenData, load_tokens
from posenc.data.synthetic import SyntheticTask
from posenc.errors import UserError
from posenc.nn.encodings.base import PositionalEncoding, PositionOutOfRange
from posenc.nn.layout import LayeredEncoding, LayerLayout, layer_kinds
from posenc.nn.mask import Window
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


def build_layout(cfg: DictConfig) -> LayerLayout:
    """Each layer's kind and window, from cfg.layout (posenc/nn/layout.py)."""
    layout = cfg.get("layout")
    if layout is None:  # a config composed without the layout group
        return LayerLayout.uniform(cfg.model.n_layer)
    try:
        kinds = layer_kinds(list(layout.pattern), cfg.model.n_layer)
        windows = {name: Window(kind.window, bool(kind.chunked)) for name, kind in layout.kinds.items()}
        mixers = {name: kind.get("mixer") or "softmax" for name, kind in layout.kinds.items()}
        return LayerLayout(kinds, windows, layout.name, mixers)
    except ValueError as e:
        raise UserError(f"layout: {e}") from None


def instantiate_encoding(node: DictConfig, group: str, sizes: dict) -> PositionalEncoding:
    """One encoding node. A key that holds an encoding node of its own (a mechanism's ``inner``,
    posenc/nn/encodings/mechanism.py) is built first, with the same sizes, and passed in: so
    ``encoding=fox encoding@encoding.inner=rope`` is FoX around RoPE, nested as deep as wanted."""
    inner = {key: instantiate_encoding(node[key], f"{group}.{key}", sizes) for key in node
             if isinstance(node[key], DictConfig) and "_target_" in node[key]}
    if inner:
        node = OmegaConf.create({k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in inner})
    return instantiate_group(node, group, **supplied(node, sizes), **inner)


def encoding_sizes(cfg: DictConfig) -> dict:
    """What the builder hands every encoding, under one name each: the model's sizes and the
    training length ``train_len`` (an encoding's own length key, learned's ``max_len`` or RoPE's
    ``original_max_len``, is null for "the training length" and reads it from there)."""
    m = cfg.model
    return {"d_model": m.d_model, "n_head": m.n_head, "n_layer": m.n_layer, "train_len": cfg.trainer.seq_len}


def supplied(node: DictConfig, sizes: dict) -> dict:
    """The sizes the node's class takes (those its __init__ names: a mechanism names none of
    d_model and n_head, which it takes from its inner encoding; d_model and n_head also to an
    __init__ taking **kwargs, as before) and the node does not set itself (a run directory's config
    from before the builder supplied them keeps its own values)."""
    takes = inspect.signature(get_class(node._target_).__init__).parameters
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
    return {k: v for k, v in sizes.items() if k not in node and (k in takes or forwards and k in ("d_model", "n_head"))}


def build_encoding(cfg: DictConfig) -> PositionalEncoding:
    """The encoding, or, when the layout gives a layer kind an encoding of its own, one per kind:
    a kind's ``encoding`` overrides the keys of ``encoding`` (Gemma 3: {base: 1000000}) or, with a
    ``_target_``, replaces it (Llama 4: NoPE); kinds whose encodings are equal share one module."""
    sizes = encoding_sizes(cfg)
    layout = cfg.get("layout")
    used = dict.fromkeys(layer_kinds(list(layout.pattern), cfg.model.n_layer)) if layout is not None else {}
    if not any(layout.kinds[k].encoding for k in used if k in layout.kinds):
        return instantiate_encoding(cfg.encoding, "encoding", sizes)
    base = OmegaConf.to_container(cfg.encoding, resolve=True)
    by_node: dict[str, PositionalEncoding] = {}
    encodings = {}
    for kind in used:
        own = OmegaConf.to_container(layout.kinds[kind].encoding, resolve=True)
        unknown = sorted(set(own) - set(base)) if "_target_" not in own else []
        if unknown:
            raise UserError(f"layout={layout.name} sets {', '.join(f'encoding.{k}' for k in unknown)} on its {kind} layers, "
                            f"which encoding '{cfg.encoding.name}' does not have — use an encoding that has it "
                            f"(e.g. encoding=rope) or another layout")
        node = own if "_target_" in own else {**base, **own}
        key = repr(sorted(node.items()))
        if key not in by_node:
            by_node[key] = instantiate_encoding(OmegaConf.create(node), f"layout.kinds.{kind}.encoding", sizes)
        encodings[kind] = by_node[key]
    try:
        return LayeredEncoding(encodings, layer_kinds(list(layout.pattern), cfg.model.n_layer), cfg.encoding.name)
    except ValueError as e:
        raise UserError(f"layout: {e}") from None


def build_model(cfg: DictConfig, vocab_size: int, encoding: PositionalEncoding | None = None) -> GPT:
    """The model cfg describes, around ``encoding`` when it is already built (training builds it
    first, before reading any data: check_encodable), else around a new one."""
    encoding = encoding if encoding is not None else build_encoding(cfg)
    return instantiate_group(cfg.model, "model", vocab_size=vocab_size, encoding=encoding, layout=build_layout(cfg))


def check_encodable(cfg: DictConfig) -> PositionalEncoding:
    """The encoding, built and held to its own rules (odd RoPE head dim, seq_len beyond learned
    max_len, a layout it cannot take): a UserError saying what to do, before any data is read."""
    try:
        encoding = build_encoding(cfg)
        encoding.check_length(cfg.trainer.seq_len)
    except PositionOutOfRange as e:
        raise UserError(str(e)) from None
    return encoding


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
