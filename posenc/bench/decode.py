"""What decoding costs, per encoding (``bench.decode=true``): a model in use is prompted and then run
a token at a time, with the cache its encoding keeps (posenc/nn/decoding.py).

At contexts c of ``bench.decode_contexts`` × the training length (1×, 4×, 16× by default), batch 1, with
no gradients, three arms in alternating rounds (``bench.rounds``) so that their ratios are taken under
the same load, as the training rows' are (timing.py):

- the encoding's cache: a prompt of c - n tokens prefilled (prefill tokens/s), then the last n =
  ``bench.decode_steps`` tokens decoded one at a time, the last of them seeing all c (decode tokens/s);
  the cache's bytes per token at c, and what it keeps (its path: keys at positions, recomputed from the
  hooks, a recurrent state, ...);
- full recomputation: each of those tokens by a forward over the whole sequence so far, what decoding
  without a cache costs (``vs full forward``: the cache's decode tokens/s over it);
- the plain reference's cache (reference.py: nanoGPT's keys and values, SDPA; learned positions as long
  as the longest context): ``vs reference``, and its bytes per token.

A context the encoding cannot reach (learned positions past max_len) is a cell that says so. The models
decode eagerly (a compiled step's graphs are for the training shape); a row's ``eager`` says so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import nn

from posenc.bench.memory import sync
from posenc.bench.reference import PlainCache, PlainGPT, recipe_of
from posenc.nn.encodings.base import PositionOutOfRange

#: what the two other arms run
RECOMPUTE_PATH = "a forward over the whole sequence per token (no cache)"
REFERENCE_PATH = "keys and values of every token (nanoGPT's cache), SDPA"


def reference_decoder(cfg: DictConfig, vocab: int, device: torch.device) -> PlainGPT:
    """The plain reference at the bench's shape and recipe, its position table as long as the longest
    context decoded: the third arm of every row's decode cells."""
    m, b = cfg.model, cfg.bench
    longest = max(int(x * b.seq_len) for x in b.decode_contexts)
    return PlainGPT(vocab, longest, m.n_layer, m.n_head, m.d_model, recipe_of(m)).to(device).eval()


def timed(device: torch.device, fn: Callable[[], object]) -> float:
    """Seconds of fn(), the device's queue drained before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def cached_round(model: nn.Module, new_cache: Callable[[], object], prompt: torch.Tensor, steps: torch.Tensor,
                 device: torch.device) -> tuple[float, float, object]:
    """(prefill seconds, decode seconds, the cache): prompt (1, c) prefilled, then each of steps (1, n) fed."""
    cache = new_cache()
    prefill = timed(device, lambda: model(prompt, cache=cache))
    decode = timed(device, lambda: [model(steps[:, i:i + 1], cache=cache) for i in range(steps.shape[1])])
    return prefill, decode, cache


def recompute_round(model: nn.Module, sequence: torch.Tensor, start: int, device: torch.device) -> float:
    """Seconds of the tokens from ``start`` on decoded by a forward over everything so far, each."""
    return timed(device, lambda: [model(sequence[:, :end]) for end in range(start + 1, sequence.shape[1] + 1)])


def median_ratio(ours: list[float], theirs: list[float]) -> tuple[float, list[float]]:
    """Throughput of ours over theirs round by round (the same tokens: a ratio of times), median and range."""
    ratios = [t / o for o, t in zip(ours, theirs)]
    return statistics.median(ratios), [min(ratios), max(ratios)]


def context_cost(model: nn.Module, reference: PlainGPT | None, vocab: int, c: int, b: DictConfig,
                 device: torch.device, autocast) -> dict:
    """One context's cells: the three arms, ``bench.rounds`` times each, after an untimed round."""
    n = int(b.decode_steps)
    if c <= n:
        raise ValueError(f"a context of {c} tokens leaves no prompt before bench.decode_steps={n} decoded tokens")
    g = torch.Generator().manual_seed(c)
    sequence = torch.randint(vocab, (1, c), generator=g).to(device)
    prompt, steps = sequence[:, :c - n], sequence[:, c - n:]
    arms: dict[str, list[float]] = {"prefill": [], "decode": [], "recompute": [], "reference": []}
    with torch.no_grad(), autocast():
        for r in range(int(b.rounds) + 1):  # round 0 warms every arm up, untimed
            prefill, decode, cache = cached_round(model, model.new_cache, prompt, steps, device)
            recompute = recompute_round(model, sequence, c - n, device)
            plain = cached_round(reference, lambda: PlainCache(reference.n_layer), prompt, steps, device) \
                if reference is not None else None
            if r:
                arms["prefill"].append(prefill)
                arms["decode"].append(decode)
                arms["recompute"].append(recompute)
                if plain is not None:
                    arms["reference"].append(plain[1])
    out = {"context": c, "status": "ok",
           "prefill_tokens_per_s": (c - n) / statistics.median(arms["prefill"]),
           "decode_tokens_per_s": n / statistics.median(arms["decode"]),
           "cache_bytes_per_token": cache.nbytes() / cache.length, "path": "; ".join(cache.describe()),
           "restarts": cache.restarts,
           "vs_recompute_of": n / statistics.median(arms["recompute"]), "recompute_path": RECOMPUTE_PATH}
    out["vs_recompute"], out["vs_recompute_range"] = median_ratio(arms["decode"], arms["recompute"])
    if plain is not None:
        out.update(vs_reference_of=n / statistics.median(arms["reference"]), reference_path=REFERENCE_PATH,
                   reference_cache_bytes_per_token=plain[2].nbytes() / plain[2].length)
        out["vs_reference"], out["vs_reference_range"] = median_ratio(arms["decode"], arms["reference"])
    return out


def decode_costs(model: nn.Module, reference: PlainGPT | None, vocab: int, b: DictConfig, device: torch.device,
                 autocast, progress: Callable[[str], None]) -> dict:
    """A row's decode cells, one per context of ``bench.decode_contexts`` × ``bench.seq_len``."""
    was_training = model.training
    model.eval()
    cells = []
    try:
        for multiple in b.decode_contexts:
            c = int(multiple * b.seq_len)
            progress(f"decoding at a context of {c} tokens ({multiple}× the training length)")
            try:
                cells.append({"multiple": multiple, **context_cost(model, reference, vocab, c, b, device, autocast)})
            except PositionOutOfRange:
                cells.append({"multiple": multiple, "context": c, "status": "beyond max_len"})
            except torch.OutOfMemoryError:
                cells.append({"multiple": multiple, "context": c, "status": "OOM"})
    finally:
        model.train(was_training)
    return {"eager": True, "steps": int(b.decode_steps), "contexts": cells}
