"""The suite parses each distinct YAML text once: ``OmegaConf.load`` memoised by the text itself.

Hydra composes by reading every config file of the defaults tree with ``OmegaConf.load``, and the
suite composes several hundred times in each worker (every option of every group, every swept
value of every preset, the CLI's errors), about 15% of each compose spent parsing the same dozens
of files again. Parsing is a pure function of the text, so the memo keys on the text read (a file
edited between two composes is a new text) and hands back a fresh config built from a deep copy of
the parsed objects, as the original would. YAML that fails to parse goes back to the original load,
so its error names the file as it does for a user. The product itself parses as Hydra does.
"""

from __future__ import annotations

import copy
import os
import pathlib
from typing import IO, Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

_original = OmegaConf.load
_parsed: dict[str, Any] = {}


def _load(file_: str | pathlib.Path | IO[Any]) -> DictConfig | ListConfig:
    if isinstance(file_, (str, pathlib.Path)):
        with open(os.path.abspath(file_), encoding="utf-8") as f:
            text = f.read()
    elif getattr(file_, "read", None) is not None and getattr(file_, "seekable", lambda: False)():
        start = file_.tell()
        text = file_.read()
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        file_.seek(start)  # the original load reads it again if the memo cannot serve it
    else:
        return _original(file_)
    if text not in _parsed:
        try:
            _parsed[text] = yaml.load(text, Loader=get_yaml_loader())
        except yaml.YAMLError:
            return _original(file_)  # the same error, naming the file
    obj = copy.deepcopy(_parsed[text])
    if obj is None:
        return OmegaConf.create()
    if not isinstance(obj, (dict, list)):
        return _original(file_)  # the original's own error for a scalar document
    return OmegaConf.create(obj)


def install() -> None:
    """Every ``OmegaConf.load`` in this process (Hydra's config sources call it) goes through the memo."""
    OmegaConf.load = staticmethod(_load)
