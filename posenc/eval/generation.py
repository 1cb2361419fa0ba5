"""`posenc generate RUN_DIR`: text from a trained run, decoded a token at a time with the cache each
layer keeps (posenc/nn/decoding.py), streamed as it is chosen.

The run is read as `posenc eval` reads it (``load_trained``: its config through RunDir, its checkpoint,
its device and precision; overrides such as ``device=cpu`` apply), and its tokenizer is the one that
packed its data (a BPE tokenizer reads its tokenizer.json back from the packed cache). The prompt is
encoded by it; a prompt the encoding cannot encode (learned positions past max_len), or a continuation
that would reach a position it cannot, is refused before anything runs. Past the training length the
model continues and says so, once; where its cache goes stale (dynamic NTK) it says that too.

Sampling: softmax(logits / temperature) over the top_k most likely tokens, drawn from a generator seeded
with ``seed`` (the same seed, prompt and run give the same text); temperature 0 is greedy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from posenc.build import build_tokenizer
from posenc.errors import UserError
from posenc.eval.run import load_trained
from posenc.nn.decoding import sample
from posenc.record.rundir import RunDir

#: how a replaced byte (an incomplete UTF-8 sequence at the end of what was decoded) reads
REPLACEMENT = "\ufffd"


@dataclass
class Settings:
    """What to generate: prompt text, how many tokens, and how each is drawn."""

    prompt: str
    max_new_tokens: int = 256
    temperature: float = 0.8
    top_k: int | None = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise UserError(f"--temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"--top-k must be at least 1, got {self.top_k}")


@dataclass
class Generated:
    """What a generation did: its tokens' ids, the prompt's length, and the time of each stage."""

    ids: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    cache: list[str]
    cache_bytes: int
    restarts: int

    @property
    def new_tokens(self) -> int:
        return len(self.ids) - self.prompt_tokens


class TextStream:
    """Token ids in, new text out: the whole continuation is decoded each time and the text not yet
    shown is returned, less a trailing incomplete character (a multi-byte UTF-8 character, or a BPE
    merge, split across tokens), which waits for the token that completes it."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.shown = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        ready = len(text.rstrip(REPLACEMENT))
        out, self.shown = text[self.shown:ready], max(self.shown, ready)
        return out

    def flush(self) -> str:
        text = self.decode(self.ids)
        out, self.shown = text[self.shown:], len(text)
        return out


def tokenizer_of(cfg, data):
    """The run's tokenizer as it packed the run's data (a learned one reads its files back)."""
    tokenizer = build_tokenizer(cfg)
    if hasattr(tokenizer, "load") and hasattr(data, "path"):
        tokenizer.load(data.path)
    return tokenizer


def refuse_beyond(model, n_prompt: int, max_new_tokens: int) -> None:
    """One error where the encoding cannot encode the prompt, or every position the continuation needs."""
    max_len = model.encoding.max_len
    if max_len is None:
        return
    name = model.encoding.name
    if n_prompt > max_len:
        raise UserError(f"the prompt is {n_prompt} tokens and encoding '{name}' can encode positions 0..{max_len - 1} "
                        f"(max_len={max_len}) — shorten the prompt to {max_len} tokens or fewer")
    if n_prompt + max_new_tokens - 1 > max_len:  # the last token chosen is never fed back
        raise UserError(f"encoding '{name}' can encode positions 0..{max_len - 1} (max_len={max_len}): a prompt of "
                        f"{n_prompt} tokens and {max_new_tokens} new ones reach position {n_prompt + max_new_tokens - 2} "
                        f"— ask for --max-new-tokens {max_len - n_prompt + 1} or fewer")


def generate_run(run_dir: Path, overrides: list[str], settings: Settings, write: Callable[[str], None],
                 say: Callable[[str], None]) -> Generated:
    """Generate from run_dir's checkpoint: the text through ``write`` as it is chosen (the prompt's first),
    what a user should know about the run (the training length crossed, a stale cache) through ``say``."""
    run = RunDir(run_dir)
    cfg, data, model, _, autocast, _ = load_trained(run, overrides, command="generate")
    model.eval()
    device = next(model.parameters()).device
    tokenizer = tokenizer_of(cfg, data)
    if not settings.prompt:
        raise UserError("the prompt is empty — give --prompt TEXT or --prompt-file PATH with some text")
    prompt = [int(i) for i in tokenizer.encode_batch([settings.prompt])[0]]
    refuse_beyond(model, len(prompt), settings.max_new_tokens)
    train_len = int(cfg.trainer.seq_len)
    stale = model.encoding.stale_cache()
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    stream = TextStream(lambda ids: tokenizer.decode(ids))
    write(tokenizer.decode(prompt))
    cache = model.new_cache()
    past = len(prompt) > train_len
    if past:
        say(f"the prompt ({len(prompt)} tokens) runs past the training length ({train_len} tokens): the model was "
            f"never trained on positions {train_len} and beyond")
    said_stale = False
    with torch.no_grad(), autocast():
        started = time.perf_counter()
        logits = model(torch.tensor([prompt], device=device), cache=cache)[0][:, -1]
        prefilled = time.perf_counter()
        for step in range(settings.max_new_tokens):
            token = sample(logits.float(), settings.temperature, settings.top_k, generator)
            write(stream.push(int(token)))
            if not past and len(prompt) + step >= train_len:  # the position of the token just chosen
                past = True
                say(f"past the training length ({train_len} tokens) from here: the model was never trained on "
                    f"positions {train_len} and beyond")
            if step + 1 == settings.max_new_tokens:
                break
            if stale and not said_stale and model.encoding.cache_epoch(cache.length + 1) != cache.epoch:
                said_stale = True
                say(f"{stale} (slower from here)")
            logits = model(token.view(1, 1), cache=cache)[0][:, -1]
        write(stream.flush())
        ended = time.perf_counter()
    return Generated(prompt + stream.ids, len(prompt), prefilled - started, ended - prefilled, cache.describe(),
                     cache.nbytes(), cache.restarts)
