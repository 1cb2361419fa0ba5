"""Whether decoding with a cache computes what the full forward computes.

A trained model is used a token at a time: the prompt runs once, and each layer keeps what its encoding
says it needs of the past (``kv_cache``, posenc/nn/encodings/cache.py). A cache that keeps the wrong
thing (keys left unrotated, gates summed from the wrong token, a window that drops a key a query still
sees) generates text no evaluation of the model ever scored. So greedy decoding from a short prompt to
4× the window, with the cache, must give at every position the logits the full forward over the same
tokens gives (float64), as configured, and to 2× with every softmax layer sliding (what the cache drops).

An encoding whose kept state goes stale as the sequence grows (``stale_cache``: Hugging Face's dynamic
NTK changes every frequency beyond its original length, and every layer's past outputs with them)
decodes by running the sequence again where it changes; the full forward over a longer window then
computes each earlier position at another length, so each position is held to the forward of its own
prefix instead, and the row says stale, with the reason. An encoding that stops at a length (learned
positions' max_len) is decoded up to it, and the next token must be refused in one line.
"""

from __future__ import annotations

import torch

from posenc.check.results import EXACT, CheckResult, Status, holds, max_abs
from posenc.check.subject import Subject, forward, seeded
from posenc.nn.encodings.base import PositionOutOfRange
from posenc.nn.model import GPT

NAME = "decoding: cached = full forward"
#: the prompt's length; decoding continues to FACTOR × the window
PROMPT, FACTOR = 5, 4
#: every softmax layer sliding with this window in the second variant
WINDOW = 5


def greedy(model: GPT, prompt: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor, str | None]:
    """Greedy decoding with a cache to ``end`` tokens (or until the model refuses a position): the tokens
    (B, n), the cached logits of each (B, n, V), and the refusal's message where one came."""
    cache = model.new_cache()
    with torch.no_grad(), seeded():
        logits = [model(prompt, cache=cache)[0]]
        tokens = prompt
        while tokens.shape[1] < end:
            token = logits[-1][:, -1:].argmax(-1)
            try:
                logits.append(model(token, cache=cache)[0])
            except PositionOutOfRange as e:
                return tokens, torch.cat(logits, dim=1), str(e)
            tokens = torch.cat((tokens, token), dim=1)
    return tokens, torch.cat(logits, dim=1), None


def decoding_gap(model: GPT, tokens: torch.Tensor, cached: torch.Tensor, per_prefix: bool) -> tuple[float, int]:
    """(max |Δ| of the cached logits against the full forward's, the first position where they differ by
    more than EXACT, or -1). per_prefix: position p against the forward of tokens 0..p alone."""
    if per_prefix:
        gaps = [max_abs(cached[:, p], forward(model, tokens[:, : p + 1])[:, p]) for p in range(tokens.shape[1])]
    else:
        diff = (cached.double() - forward(model, tokens).double()).abs().amax(dim=(0, 2))  # (n,)
        gaps = diff.tolist()
    worst = max(gaps)
    return worst, next((p for p, g in enumerate(gaps) if g > EXACT), -1)


def variants(s: Subject) -> dict[str, object]:
    """The configs decoded: as configured, and every softmax layer sliding (not with linear attention,
    which has no window, or where no layer attends)."""
    out: dict[str, object] = {"": None}
    softmax = [k for k, kind in s.cfg.layout.kinds.items() if kind.get("mixer", "softmax") == "softmax"]
    if s.softmax and softmax:
        out[f"sliding {WINDOW}"] = s.with_changes(**{f"layout.kinds.{k}.window": WINDOW for k in softmax},
                                                  **{f"layout.kinds.{k}.chunked": False for k in softmax})
    return out


def cache_consistency(s: Subject) -> list[CheckResult]:
    """Greedy decoding with the cache gives the full forward's logits at every position, to 4× the window."""
    measured, notes, kept = [], [], ""
    stale = None
    for label, cfg in variants(s).items():
        model = s.model(cfg=cfg)
        stale = model.encoding.stale_cache()
        end = (FACTOR if not label else 2) * s.T  # a window's eviction shows within 2×
        tokens, cached, refused = greedy(model, s.tokens(batch=1, T=PROMPT), end)
        if refused is not None and "\n" in refused.strip():
            return [holds(NAME, False, "refused", f"decoding past position {tokens.shape[1] - 1} was refused in "
                                                  f"more than one line")]
        worst, first = decoding_gap(model, tokens, cached, per_prefix=stale is not None)
        kept = kept or "; ".join(model.new_cache().describe())
        where = f" ({label})" if label else ""
        stop = f", refuses position {tokens.shape[1]}" if refused is not None else ""
        measured.append(f"max |Δ| {worst:.1e} over {tokens.shape[1]} positions{where}{stop}")
        if first >= 0:
            notes.append(f"decoding with the cache{where} gives other logits than the full forward from position "
                         f"{first} (prompt {PROMPT} tokens; by up to {worst:.1e}): what the encoding's kv_cache keeps "
                         f"({kept}) is not what its hooks compute over the whole sequence")
    ok = not notes
    text = "; ".join(measured) + f" — keeps {kept}"
    if ok and stale:
        return [CheckResult(NAME, Status.PASS, text, f"held to each prefix's forward: {stale}", caveat=stale)]
    return [holds(NAME, ok, text, "; ".join(notes))]
