"""Nested state (a checkpoint: weights, optimiser, RNGs, config) <-> one safetensors file, no pickle.

Run directories are shared between researchers, and a full unpickle (torch.load without
weights_only) runs whatever code the file names, so a checkpoint holds only what cannot run code: the tensors
in the safetensors format (a JSON header and raw bytes) and everything else as JSON in that
header's metadata. Reading one can produce tensors, numbers, strings, lists, dicts, tuples and
numpy arrays, nothing else. The file is written to a temp file and renamed: a crash mid-write
leaves the previous file whole.

JSON has no tensors, tuples, non-string dict keys or arrays; they are written as one-key objects:
``{"$tensor": name}`` (the tensor stored under that name), ``{"$tuple": [...]}`` (Python's RNG
state must come back a tuple), ``{"$items": [[key, value], ...]}`` (the optimiser's integer
parameter ids) and ``{"$ndarray": {...}}`` (numpy's RNG state). Tensors that are the same view of
one storage (tied weights) are stored once.

A posenc checkpoint is such a state at ``CHECKPOINT_VERSION`` holding ``REQUIRED_KEYS``
(posenc/train/checkpoint.py writes it); ``read_checkpoint`` refuses anything else in one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import safe_open

from posenc.errors import UserError

if TYPE_CHECKING:
    import torch

FORMAT = "posenc-state"
TENSOR, TUPLE, ITEMS, NDARRAY = "$tensor", "$tuple", "$items", "$ndarray"
MARKERS = (TENSOR, TUPLE, ITEMS, NDARRAY)
CHECKPOINT_VERSION = 2  # 1: a torch.save pickle (checkpoints/*.pt), read only by `posenc convert`
REQUIRED_KEYS = ("version", "model", "optimizer", "scheduler", "sampler", "rng", "step", "tokens", "config")


class Encoder:
    """Walks a nested state, moving tensors into ``tensors`` and returning the JSON-ready rest."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._seen: dict[tuple, str] = {}  # a view of a storage -> the name it is stored under

    def tensor(self, t: torch.Tensor, path: str) -> dict:
        t = t.detach()
        view = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if view not in self._seen:  # a tied weight is the same view twice: store it once
            self._seen[view] = path
            self.tensors[path] = t.cpu().contiguous()
        return {TENSOR: self._seen[view]}

    def encode(self, obj: Any, path: str = "") -> Any:
        import torch  # here, not at import: reading a run's header (compare, plot) needs no torch

        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, path or "tensor")
        if isinstance(obj, np.ndarray):
            return {NDARRAY: {"dtype": obj.dtype.str, "shape": list(obj.shape), "data": obj.ravel().tolist()}}
        if isinstance(obj, np.generic):
            return obj.item()
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, tuple):
            return {TUPLE: [self.encode(v, f"{path}.{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, f"{path}.{i}") for i, v in enumerate(obj)]
        if isinstance(obj, dict):
            if all(isinstance(k, str) and k not in MARKERS for k in obj):
                return {k: self.encode(v, f"{path}.{k}" if path else k) for k, v in obj.items()}
            return {ITEMS: [[self.encode(k), self.encode(v, f"{path}.{k}")] for k, v in obj.items()]}
        raise TypeError(f"{path or 'state'}: a {type(obj).__name__} cannot be stored without pickle — "
                        f"store tensors, numbers, strings, lists, tuples or dicts")


def decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The nested state ``Encoder.encode`` wrote, with its tensors taken from ``tensors``."""
    if isinstance(obj, list):
        return [decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (key, value), = obj.items()
        if key == TENSOR:
            return tensors[value]
        if key == TUPLE:
            return tuple(decode(v, tensors) for v in value)
        if key == ITEMS:
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in value}
        if key == NDARRAY:
            dtype = np.dtype(value["dtype"])
            if dtype.kind not in "biuf":  # numbers only: an object array would hold whatever the file says
                raise ValueError(f"an array of dtype {dtype} is not a state posenc writes")
            return np.asarray(value["data"], dtype=dtype).reshape(value["shape"])
    return {k: decode(v, tensors) for k, v in obj.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def save_state(state: dict, path: Path) -> None:
    """Write state to path (safetensors: tensors + JSON metadata) via a temp file and a rename."""
    from safetensors.torch import save_file

    encoder = Encoder()
    tree = encoder.encode(state)
    tmp = path.with_name(path.name + ".tmp")
    save_file(encoder.tensors, str(tmp), metadata={"format": FORMAT, "state": json.dumps(tree)})
    # safetensors writes through a temp file of its own, created 0600; a checkpoint is a run file like
    # the others, readable by whoever may read the run dir: the mode open() gives (0644 under umask 0022)
    os.chmod(tmp, new_file_mode())
    os.replace(tmp, path)


def new_file_mode() -> int:
    """0o666 less the process's umask: the mode ``open(path, "w")`` gives a new file."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where the OS says (Linux: /proc/self/status);
    elsewhere set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _NoTensors(dict):
    """Every tensor read as None: the state's header alone."""

    def __missing__(self, key: str) -> None:
        return None


def load_state(path: Path, tensors: bool = True) -> dict:
    """The state save_state wrote (tensors on the CPU; with tensors=False only its header: the
    numbers, strings and config, each tensor None, no tensor bytes read). A file that is not
    one, including any pickle, raises ValueError (safetensors reads a JSON header and raw
    bytes, never code)."""
    with safe_open(str(path), framework="numpy") as f:  # the header alone: no torch needed
        metadata = f.metadata() or {}
    if metadata.get("format") != FORMAT or "state" not in metadata:
        raise ValueError(f"{path} is a safetensors file but not a posenc state")
    return decode(json.loads(metadata["state"]), read_tensors(path) if tensors else _NoTensors())


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, on the CPU (torch imported here: a header needs none)."""
    from safetensors.torch import load_file

    return load_file(str(path))


def read_checkpoint(path: Path, tensors: bool = True) -> dict:
    """A posenc checkpoint file; a missing, corrupt or foreign file (a pickle included) is a
    UserError saying so. Nothing in the file can run code. tensors=False reads its header alone
    (step, config, ...; every tensor None)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at '{path}' — the run saved none yet (see trainer.checkpoint_interval); "
                        f"start a new run instead")
    try:
        state = load_state(path, tensors=tensors)
    except Exception as e:  # noqa: BLE001 - a pickle, truncated bytes, another safetensors file...
        raise UserError(f"checkpoint '{path}' is not a posenc checkpoint, or is corrupt ({type(e).__name__}); "
                        f"posenc reads only its own safetensors checkpoints — point at a run dir made by "
                        f"`posenc train`, or resume from an earlier copy") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise UserError(f"'{path}' is not a posenc checkpoint — point at a run dir made by `posenc train`")
    if state["version"] != CHECKPOINT_VERSION:
        raise UserError(f"checkpoint '{path}' has format v{state['version']}, this posenc reads "
                        f"v{CHECKPOINT_VERSION} — use the posenc version that wrote it, or start a new run")
    return state
