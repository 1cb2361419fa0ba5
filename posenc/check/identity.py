"""What a verdict of `posenc check` is about (posenc/check/verdict.py): its key, and the encoding as the
run configured it.

The key (``key_of``) hashes everything that decides a verdict, so that none is carried to code or a
config it did not measure:

- the code the check's model, masks, attention paths, recurrences, training step and checks run:
  every posenc module importing posenc/check/runner.py, posenc/build.py and posenc/train/state.py
  runs (posenc/record/imports.py, read from the source, function-level imports included), each as
  code (posenc/record/code.py: a comment is no change) — the CUDA rows (cuda.py), verdict.py and
  shipped.py aside (``path_files``): a future leak in posenc/nn/dense.py is another key;
- the code of the encoding's classes, as provenance hashes it (posenc/record/provenance.py: every
  module of the plug-in and of posenc that the class imports);
- the encoding, layout and model configs (the shape aside), as written (a different ``encoding.base``
  is another encoding; a different learning rate or data the same one), the window measured in
  (``check_length``: the check's 24 tokens, or the run's length when shorter), the run's training
  precision (trainer.precision resolved: fp32, bf16, fp16) and the positions the precision rows
  reach (``subject.measured_positions``: the run's evaluation's, at least 4096);
- the versions of torch, triton and flash-linear-attention (``library_versions``: "absent" where
  not installed): what their kernels compute changes with them.

A warning names the encoding as the run configured it (``variant``): its name and the options where
it differs from its config file, ``rope scaling=dynamic scaling_factor=4``, and the `posenc check`
that shows its rows (``check_command``).
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.check.subject import check_length, measured_positions, training_precision
from posenc.config.catalogue import encoding_options
from posenc.errors import UserError
from posenc.record.code import code_of
from posenc.record.directory import plain_number
from posenc.record.imports import package_sources
from posenc.record.provenance import code_record, encoding_targets, posenc_root

#: where the path a verdict is about starts: what importing these runs is what the check runs
PATH_MODULES = ("posenc.check.runner", "posenc.build", "posenc.train.state")
#: posenc's modules on that path whose code does not decide a verdict (the CUDA rows are left out)
NOT_ON_THE_PATH = ("posenc/check/verdict.py", "posenc/check/identity.py", "posenc/check/shipped.py",
                   "posenc/check/cuda.py")
#: the libraries whose versions decide a verdict: name in the key -> its distributions, first installed
LIBRARIES = {"torch": ("torch",), "triton": ("triton", "pytorch-triton"),
             "fla": ("flash-linear-attention", "fla-core")}
#: model keys the check sets itself (SHAPE): not part of what a verdict is about
SHAPE_KEYS = ("n_layer", "n_head", "d_model", "dropout")


def canonical(node: object) -> object:
    """A config as plain data with one spelling per value (10000 and 10000.0 alike)."""
    if isinstance(node, dict):
        return {str(k): canonical(v) for k, v in sorted(node.items(), key=lambda kv: str(kv[0]))}
    if isinstance(node, list):
        return [canonical(v) for v in node]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    return node


def path_files() -> dict[str, Path]:
    """Every posenc module on the check's path: what importing PATH_MODULES runs within posenc
    (NOT_ON_THE_PATH aside), by its name under posenc's root."""
    root = posenc_root()
    found = {str(p.resolve().relative_to(root)): p for module in PATH_MODULES for p in package_sources(module, root)}
    return {name: found[name] for name in sorted(found) if name not in NOT_ON_THE_PATH}


def path_digest() -> str:
    """The code of every module on the check's path (``path_files``), each as code."""
    return hashlib.sha256("\n".join(f"{name}:{code_of(p)[0]}" for name, p in path_files().items()).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    """{torch, triton, fla: the installed version, or "absent"} (importlib.metadata, nothing imported)."""
    out = {}
    for name, distributions in LIBRARIES.items():
        out[name] = "absent"
        for distribution in distributions:
            try:
                out[name] = version(distribution)
                break
            except PackageNotFoundError:
                continue
    return out


def key_of(cfg: DictConfig) -> str:
    """What decides a verdict, hashed (the module doc): 32 hex digits."""
    model = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=False).items() if k not in SHAPE_KEYS}
    what = {"path": path_digest(),
            "code": {target: code_record(target)["sha256"] for target in encoding_targets(cfg)},
            "encoding": OmegaConf.to_container(cfg.encoding, resolve=False),
            "layout": OmegaConf.to_container(cfg.layout, resolve=False), "model": model, "T": check_length(cfg),
            "precision": training_precision(cfg), "positions": measured_positions(cfg),
            "libraries": library_versions()}
    return hashlib.sha256(json.dumps(canonical(what), sort_keys=True, default=str).encode()).hexdigest()[:32]


def variant(cfg: DictConfig) -> str:
    """The encoding as the run configured it: its name, and each option where cfg differs from its
    config file (an encoding it wraps by that one's name): 'rope scaling=dynamic scaling_factor=4'."""
    encoding = OmegaConf.to_container(cfg.encoding, resolve=False)
    name = str(encoding.get("name", "?"))
    try:
        defaults = encoding_options(name)
    except UserError:  # no config file of that name (a config built by hand): the name alone
        return name
    changed = []
    for key, value in encoding.items():
        if key in ("_target_", "name"):
            continue
        if isinstance(value, dict):
            if value.get("name") != defaults.get(key):
                changed.append(f"{key}={value.get('name')}")
        elif key not in defaults or canonical(value) != canonical(defaults[key]):
            changed.append(f"{key}={plain_number(value)}")
    return " ".join([name, *changed])


def check_command(cfg: DictConfig) -> str:
    """The `posenc check` that shows every row of cfg's verdict."""
    encoding = OmegaConf.to_container(cfg.encoding, resolve=False)
    parts = [f"encoding={encoding.get('name', '?')}"]
    for item in variant(cfg).split(" ")[1:]:
        key, _, value = item.partition("=")
        parts.append(f"encoding@encoding.{key}={value}" if isinstance(encoding.get(key), dict)
                     else f"encoding.{key}={value}")
    precision = training_precision(cfg)
    if precision != "fp32":
        parts.append(f"trainer.precision={precision}")
    return "posenc check " + " ".join(parts)
