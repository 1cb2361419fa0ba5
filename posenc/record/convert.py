"""`posenc convert RUN_DIR`: rewrite a run dir's pickled checkpoints (format 1, ``checkpoints/*.pt``)
as safetensors + JSON (format 2), once, when its owner asks.

The pickle is read with ``torch.load(weights_only=True)`` and an allow-list of exactly
what posenc's format 1 held besides tensors and plain Python values: numpy's RNG state (an array
of uint32). PyTorch's restricted unpickler refuses any other global, so a file that names
``os.system`` or ``exec`` is refused and nothing in it runs. There is no full unpickle
(``weights_only=False``): every format-1 file posenc wrote holds only what the allow-list admits,
and a file that needs more is not posenc's checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from posenc.errors import UserError
from posenc.record.rundir import LEGACY_CHECKPOINTS, LEGACY_SUFFIX, RunDir
from posenc.record.statefile import CHECKPOINT_VERSION, REQUIRED_KEYS, save_state

try:  # numpy's array reconstructor: numpy 2 keeps it in numpy._core (its numpy.core is a deprecated alias)
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x (1.26 has a numpy._core whose submodules are not its attributes until imported)
    from numpy.core.multiarray import _reconstruct
#: what numpy's RNG state (np.random.get_state(): an ndarray of uint32) pickles as: the reconstructor
#: under either name (a file written by numpy 1.x names numpy.core, by numpy 2 numpy._core), the array,
#: its dtype and the dtype's class (np.dtypes.UInt32DType, named so only from numpy 1.25 on)
NUMPY_RNG_STATE = [np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                   (_reconstruct, "numpy._core.multiarray._reconstruct"),
                   (_reconstruct, "numpy.core.multiarray._reconstruct")]


def read_pickled(path: Path) -> dict:
    """A format-1 checkpoint, by restricted unpickling: tensors, Python values, numpy's RNG state."""
    try:
        with torch.serialization.safe_globals(NUMPY_RNG_STATE):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle.UnpicklingError naming the refused global, or garbage
        unsafe = _unsafe_globals(path)
        what = f"it names {', '.join(unsafe)}" if unsafe else f"it is not a checkpoint torch can read ({type(e).__name__})"
        raise UserError(f"'{path}' holds more than tensors and RNG state ({what}), so it is not a checkpoint "
                        f"posenc wrote: it was not loaded and nothing in it ran — retrain the run, or remove "
                        f"the file if it does not belong there") from None


def _unsafe_globals(path: Path) -> list[str]:
    """The globals a pickle names beyond the allow-list (read from its opcodes, never executed)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a torch zip file at all
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" if not isinstance(g, tuple) else g[1] for g in NUMPY_RNG_STATE}
    return [n for n in names if n not in allowed]


def convert(run_dir: Path) -> list[Path]:
    """Write checkpoints/<kind>.safetensors beside each checkpoints/<kind>.pt of run_dir (the
    pickles are left as they are); returns the files written. Refused with a UserError, writing
    nothing, when the run dir has no pickled checkpoint or one is not a posenc checkpoint."""
    run = RunDir(run_dir)
    pickled = sorted(run.checkpoints_dir.glob(f"*{LEGACY_SUFFIX}")) if run.path.is_dir() else []
    if not pickled:
        raise UserError(f"'{run.path}' has no pickled checkpoint ({LEGACY_CHECKPOINTS}) to convert — "
                        f"pass the directory of a run made by posenc before checkpoint format {CHECKPOINT_VERSION}")
    states = {}
    for path in pickled:  # read every file before writing any: a refusal leaves the run dir as it was
        state = read_pickled(path)
        if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS) or state["version"] != 1:
            raise UserError(f"'{path}' is not a posenc checkpoint of format 1 — nothing was converted")
        states[path.stem] = {**state, "version": CHECKPOINT_VERSION}
    written = []
    for kind, state in states.items():
        save_state(state, run.checkpoint(kind))
        written.append(run.checkpoint(kind))
    return written
