"""The position-bias probe: what b_h(i, j) each layer adds to its logits, read from the hooks the
layer's encoding offers (``for_layer``: a layout or a plug-in may give every layer its own), never
assuming a table over distances.

- a *relative* bias (it overrides ``distance_bias``): the table b_h(n), n = 0..T-1 — the whole bias;
- any other bias (FIRE's, which divides by the query's position; a bias of i and j apart): one
  row per probed query position i, b_h(i, i - n) for n = 0..i, from ``position_bias`` asked for
  that query alone (as the chunked path of long evaluation asks for a slice of queries). Rows
  that differ between queries are what makes such a bias not a function of i - j.

Layers that share one encoding module (a bias computed once per forward, as T5's) are one entry.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: the query positions an absolute bias is read at, as fractions of the probed length
QUERY_FRACTIONS = (0.25, 0.5, 1.0)


def bias_layers(model: nn.Module) -> list[tuple[list[int], nn.Module]]:
    """(layers, encoding) for each distinct encoding with a position bias among the model's layers."""
    found: dict[int, tuple[list[int], nn.Module]] = {}
    for layer in range(len(model.blocks)):
        encoding = model.encoding.for_layer(layer)
        if encoding.offers("position_bias"):
            found.setdefault(id(encoding), ([], encoding))[0].append(layer)
    return list(found.values())


def query_positions(T: int) -> list[int]:
    """The query positions an absolute bias is read at: a quarter, half and all of T (the last)."""
    return sorted({max(0, round(f * T) - 1) for f in QUERY_FRACTIONS})


def row_at(encoding: nn.Module, i: int, device: torch.device | str) -> Tensor:
    """b_h(i, i - n) for n = 0..i: (H, i + 1), float32 on the CPU."""
    q = torch.tensor([i], device=device)
    k = torch.arange(i + 1, device=device)
    return encoding.position_bias(q, k)[:, 0, :].flip(-1).float().cpu()  # (H, 1, i+1) -> by distance


@torch.no_grad()
def position_bias_curve(encoding: nn.Module, T: int, device: torch.device | str = "cpu") -> dict:
    """One encoding's bias at length T: {"relative", "distance": 0..T-1, "bias": (H, T) — the
    table b_h(n) of a relative bias, else the last query's row b_h(T-1, T-1-n) — and for a bias
    that is not relative "by_query": {str(i): (H, i+1) rows b_h(i, i - n)}}."""
    encoding.prepare(T)
    n = torch.arange(T, device=device)
    if encoding.offers("distance_bias"):
        table = encoding.distance_bias(n).float().cpu()  # (H, T)
        return {"relative": True, "distance": n.tolist(), "bias": table.tolist()}
    rows = {i: row_at(encoding, i, device) for i in query_positions(T)}
    return {"relative": False, "distance": n.tolist(), "bias": rows[T - 1].tolist(),
            "by_query": {str(i): row.tolist() for i, row in rows.items()}}


@torch.no_grad()
def position_bias_curves(model: nn.Module, T: int, device: torch.device | str = "cpu") -> list[dict] | None:
    """Every distinct layer encoding's bias (``position_bias_curve``) with the layers that use it
    and its name; None for a model without a position bias in any layer."""
    found = bias_layers(model)
    if not found:
        return None
    return [{"layers": layers, "name": encoding.name, **position_bias_curve(encoding, T, device)}
            for layers, encoding in found]
