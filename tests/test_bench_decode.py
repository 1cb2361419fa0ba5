"""`posenc bench bench.decode=true`: what decoding costs per encoding, beside the training rows. The three
arms compute what they claim (the reference's KV cache is its own forward), and the cells report what a
user reads them for: a cache the size of the reference's for keys and values, a sliding window's that
stops growing, a recurrent state's that shrinks per token, learned positions refused past max_len."""

from __future__ import annotations

import io
from contextlib import nullcontext

import torch
from conftest import TINY
from rich.console import Console

from posenc.bench import render
from posenc.bench.decode import decode_costs
from posenc.bench.reference import PlainCache, PlainGPT
from posenc.bench.run import bench
from posenc.build import build_model
from posenc.config import compose
from posenc.nn.flavors import get_flavor

DECODE = [*TINY, "bench.steps=1", "bench.rounds=1", "bench.warmup=0", "bench.decode=true", "bench.decode_steps=2",
          "bench.decode_contexts=[1,4]"]


def test_the_references_kv_cache_decodes_as_its_own_forward():
    torch.manual_seed(0)
    model = PlainGPT(64, 40, 2, 2, 32, get_flavor("llama")).double().eval()
    tokens = torch.randint(64, (1, 30))
    cache = PlainCache(2)
    with torch.no_grad():
        cached = [model(tokens[:, :10], cache=cache)[0]] + [model(tokens[:, i:i + 1], cache=cache)[0] for i in range(10, 30)]
        full = model(tokens)[0]
    assert torch.allclose(torch.cat(cached, dim=1), full, atol=1e-12)
    assert cache.nbytes() == 2 * 2 * 30 * 32 * 8  # keys and values, 2 layers, 30 tokens, d = 32, float64


def cells(result: dict, name: str) -> dict[int, dict]:
    [row] = [r for r in result["results"] if r["name"] == name]
    return {c["multiple"]: c for c in row["decode"]["contexts"]}


def test_decode_cells_say_speed_memory_and_path_against_a_forward_per_token_and_the_reference():
    result = bench([*DECODE, "bench.encodings=[rope,learned]"])
    rope, learned = cells(result, "rope"), cells(result, "learned")
    for cell in rope.values():
        assert cell["status"] == "ok" and cell["decode_tokens_per_s"] > 0 and cell["prefill_tokens_per_s"] > 0
        assert cell["vs_recompute"] > 0 and cell["vs_reference"] > 0 and len(cell["vs_recompute_range"]) == 2
        assert cell["path"] == "keys at their positions, values"
        # RoPE keeps what the reference keeps: a key and a value per token and layer (1 layer, d = 32, float32)
        assert cell["cache_bytes_per_token"] == cell["reference_cache_bytes_per_token"] == 2 * 32 * 4
    assert learned[1]["status"] == "ok" and learned[4]["status"] == "beyond max_len"
    assert "nope" not in {r["name"] for r in result["results"] if "decode" in r}  # nope is timed, not decoded here
    out = Console(file=io.StringIO(), width=250)
    for t in render.tables(result):
        out.print(t)
    text = out.file.getvalue()
    assert "decoding" in text and "beyond max_len" in text and "vs full forward" in text


def decoded_alone(*overrides: str) -> dict[int, dict]:
    """The decode cells of one model, without the bench's training rows or reference."""
    cfg = compose([*DECODE, *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, 256)
    cells = decode_costs(model, None, 256, cfg.bench, torch.device("cpu"), nullcontext, lambda what: None)
    return {c["multiple"]: c for c in cells["contexts"]}


def test_a_sliding_window_and_a_recurrent_state_keep_less_per_token_as_the_context_grows():
    window = decoded_alone("encoding=rope", "layout=sliding", "layout.window=8")
    recurrent = decoded_alone("encoding=nope", "layout=jamba_like", "model.n_layer=2")
    for kept in (window, recurrent):
        assert kept[4]["cache_bytes_per_token"] < kept[1]["cache_bytes_per_token"] / 3
    assert "recurrent state" in recurrent[1]["path"] and "vs_reference" not in window[1]
