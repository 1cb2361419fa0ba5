"""`posenc probe RUN_DIR [overrides…]`: attention probes of a trained run (posenc.eval.probes).

Reads the run's checkpoint and config as `posenc eval` does, runs one forward over the first
validation windows at ``lengths`` × the training length (the same tokens for every run, so runs
compare), and writes ``probes/probes.json`` and its PNG figures into the run directory: attention
entropy per layer and head against query position and context length, mean attention distance
per head, RoPE's per-frequency q/k norms (Barbero et al., 2025), and position biases b_h(n).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from posenc.errors import UserError
from posenc.eval.probes import probe_lengths, write_probes
from posenc.eval.run import load_trained

#: evaluation-length multiples probed by default
MULTIPLES = (1, 2, 4)


def probe_run(run_dir: Path, overrides: list[str], multiples=MULTIPLES, windows: int = 2) -> list[Path]:
    """Probe run_dir's model at multiples × its training length; returns the files written."""
    run_dir = Path(run_dir)
    cfg, data, model, _, _ = load_trained(run_dir, overrides)
    device = next(model.parameters()).device
    T = int(cfg.trainer.seq_len)
    idx = {}
    for m in multiples:
        length = m * T
        if model.encoding.max_len is not None and length > model.encoding.max_len:
            continue  # a learned table has no positions there: nothing to probe
        if len(data.validation) < windows * length:
            raise UserError(f"the validation split has {len(data.validation)} tokens, fewer than {windows} windows "
                            f"of {length} — probe shorter lengths")
        w = np.asarray(data.validation[: windows * length], dtype=np.int64).reshape(windows, length)
        idx[length] = torch.from_numpy(w).to(device)
    with torch.no_grad():
        probes = probe_lengths(model, idx)
    return write_probes(probes, run_dir / "probes", T)
