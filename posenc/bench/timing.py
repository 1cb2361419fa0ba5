"""`posenc bench`: what each encoding costs per training step, at one shape, on this machine.

For every encoding in ``bench.encodings`` it times whole training steps (forward, backward,
gradient clipping, AdamW) after a warm-up, in rounds interleaved across models so that a
noisy machine slows all of them alike, and reports the median round: tokens/s, ms/step,
MFU = tokens/s · FLOPs/token / peak FLOP/s with FLOPs/token = 6N + 12·L·d·T (PaLM, appendix
B), peak memory, and throughput relative to ``nope`` and to a plain reference model.

The reference is the smallest honest baseline: a nanoGPT-style block stack written here, with
learned absolute positions and SDPA's causal kernel, at the same shape and settings. posenc's
ratio to it is the price of the framework, separate from the price of the encoding.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from posenc.config import compose, group_options, parse_overrides
from posenc.nn.encodings.base import PositionOutOfRange
from posenc.errors import UserError
from posenc.hardware import (autocast_context, enable_fast_matmul, peak_flops, resolve_device, resolve_precision,
                             use_compile)
from posenc.build import build_model, build_tokenizer, seed_everything
from posenc.train.loop import configure_optimizer

REFERENCE = "reference"


# --- the plain reference: nanoGPT's model, nothing else --------------------------------
class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class PlainGPT(nn.Module):
    """nanoGPT (Karpathy): token + learned position embeddings, pre-LN blocks, tied head."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.n_layer, self.d_model = n_layer, d_model

    def forward(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_token(self, seq_len: int) -> float:
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()  # a lookup, not a matmul
        return 6 * n + 12 * self.n_layer * self.d_model * seq_len


# --- timing -----------------------------------------------------------------------------
@dataclass
class Subject:
    """One model under test with its optimizer and a fixed batch."""

    name: str
    model: nn.Module
    step: Callable[[], None]
    flops_per_token: float
    options: dict = field(default_factory=dict)
    round_s: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    eval: dict | None = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model: nn.Module, run: nn.Module, optimizer, autocast, x: Tensor, y: Tensor) -> Callable[[], None]:
    """One training step as train.py takes it; no host synchronisation inside."""

    def step() -> None:
        with autocast():
            _, loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def resident_bytes(model: nn.Module, optimizer) -> int:
    """Parameters, gradients and optimizer state: what a step holds besides activations."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, Tensor))
    return 2 * params + state


def saved_activation_bytes(model: nn.Module, forward: Callable[[], None]) -> int:
    """Bytes autograd saves for the backward during one forward (distinct storages, not the
    parameters): on CPU, where there is no allocator to ask, the step's activation memory."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(storages.values())


def measure_peak(subject: Subject, optimizer, device: torch.device, autocast, x: Tensor, y: Tensor) -> int:
    """Peak bytes of one training step of this model alone (other models stay resident)."""
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        subject.step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base + resident_bytes(subject.model, optimizer)

    def forward() -> None:
        with autocast():
            subject.model(x, y)

    return resident_bytes(subject.model, optimizer) + saved_activation_bytes(subject.model, forward)


def long_eval(subject: Subject, device: torch.device, autocast, vocab: int, length: int) -> dict:
    """Forward only, no grad, batch 1, at ``length`` tokens: does it fit, and in how long."""
    idx = torch.randint(vocab, (1, length), device=device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        with torch.no_grad(), autocast():
            subject.model(idx)
        sync(device)
    except PositionOutOfRange:
        return {"length": length, "status": "beyond max_len"}
    except torch.OutOfMemoryError:
        return {"length": length, "status": "OOM"}
    out = {"length": length, "status": "ok", "seconds": time.perf_counter() - start}
    if device.type == "cuda":
        out["peak_mem_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return out


# --- the run ----------------------------------------------------------------------------
def encoding_config(overrides: list[str], name: str) -> DictConfig:
    """The config for one encoding of the list. An ``encoding.KEY=V`` override applies to the
    encodings that have KEY (``encoding.base=500`` changes rope, not nope)."""
    parsed = parse_overrides(overrides)
    own = [o.input_line for key, _, o in parsed if not key.startswith("encoding.")]
    cfg = compose([*own, f"encoding={name}"])
    keys = [o.input_line for key, _, o in parsed if key.startswith("encoding.") and key.split(".", 1)[1] in cfg.encoding]
    return compose([*own, f"encoding={name}", *keys]) if keys else cfg


def check_encoding_overrides(overrides: list[str], names: list[str]) -> None:
    """An ``encoding.KEY`` that no encoding in the list has is a typo: say so."""
    for key, _, _ in parse_overrides(overrides):
        if key.startswith("encoding.") and not any(
            key.split(".", 1)[1] in compose([f"encoding={n}"]).encoding for n in names
        ):
            raise UserError(f"no encoding in bench.encodings={names} has the option '{key}' — "
                            f"see `posenc encodings` for each one's options")


def validate(b: DictConfig) -> None:
    for key in ("steps", "rounds", "batch_size", "seq_len"):
        if b[key] <= 0:
            raise UserError(f"bench.{key} must be positive, got {b[key]}")
    if b.warmup < 0 or b.eval_length_multiple < 0:
        raise UserError("bench.warmup and bench.eval_length_multiple must be >= 0")


def bench(overrides: list[str], progress: Callable[[str], None] = lambda _: None) -> dict:
    """Time every encoding (and the reference) at one shape; return the JSON-ready results."""
    parsed = parse_overrides(overrides)
    # `encoding=a,b` selects, as bench.encodings
    chosen = [value if isinstance(value, list) else [value] for key, value, _ in parsed if key == "encoding"]
    overrides = [o.input_line for key, _, o in parsed if key != "encoding"]
    cfg = compose([o.input_line for key, _, o in parsed if key != "encoding" and not key.startswith("encoding.")])
    b = cfg.bench
    validate(b)
    names = chosen[-1] if chosen else list(b.encodings) if b.encodings else group_options("encoding")
    check_encoding_overrides(overrides, names)
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.trainer.precision, device)
    autocast = autocast_context(precision, device)
    enable_fast_matmul(device)
    compiled = use_compile(cfg.trainer.compile, device)
    vocab = build_tokenizer(cfg).vocab_size
    B, T = int(b.batch_size), int(b.seq_len)
    torch.manual_seed(cfg.seed)
    window = torch.randint(vocab, (B, T + 1)).to(device)
    x, y = window[:, :-1], window[:, 1:]

    subjects, optimizers = [], []
    for name in [*names, *([REFERENCE] if b.reference else [])]:
        progress(f"building {name}")
        seed_everything(cfg.seed)
        if name == REFERENCE:
            m = cfg.model
            model, options = PlainGPT(vocab, T, m.n_layer, m.n_head, m.d_model), {}
        else:
            model = build_model(encoding_config(overrides, name), vocab)
            options = model.encoding.options()
            try:
                model.encoding.check_length(T)
            except PositionOutOfRange as e:
                raise UserError(str(e)) from None
        model.to(device).train()
        optimizer = configure_optimizer(model, cfg.trainer, device)
        run = torch.compile(model) if compiled else model
        subjects.append(Subject(name, model, make_step(model, run, optimizer, autocast, x, y),
                                model.flops_per_token(T), options))
        optimizers.append(optimizer)

    for s in subjects:
        progress(f"warming up {s.name}")
        for _ in range(b.warmup):
            s.step()
        sync(device)
    for r in range(b.rounds):
        for s in subjects:  # interleaved: a busy machine slows every model alike
            progress(f"round {r + 1}/{b.rounds}: {s.name}")
            sync(device)
            start = time.perf_counter()
            for _ in range(b.steps):
                s.step()
            sync(device)
            s.round_s.append(time.perf_counter() - start)
    for s, optimizer in zip(subjects, optimizers):
        progress(f"memory of {s.name}")
        s.peak_bytes = measure_peak(s, optimizer, device, autocast, x, y)
        if b.eval_length_multiple and s.name != REFERENCE:
            progress(f"{b.eval_length_multiple}x length eval of {s.name}")
            s.eval = long_eval(s, device, autocast, vocab, T * int(b.eval_length_multiple))

    peak = peak_flops(device, b.peak_flops)
    rows = [row(s, B * T, b.steps, peak) for s in subjects]
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        for other, key in (("nope", "vs_nope"), (REFERENCE, "vs_reference")):
            r[key] = r["tokens_per_s"] / by_name[other]["tokens_per_s"] if other in by_name else None
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "compile": compiled, "torch": torch.__version__,
        "shape": {**{k: cfg.model[k] for k in ("n_layer", "n_head", "d_model")}, "batch_size": B, "seq_len": T},
        "steps": b.steps, "warmup": b.warmup, "rounds": b.rounds, "peak_flops": peak,
        "memory_method": ("torch.cuda.max_memory_allocated over one step + params, grads, optimizer state"
                          if device.type == "cuda" else
                          "params + grads + optimizer state + tensors saved for backward (CPU estimate)"),
        "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "config": OmegaConf.to_container(b, resolve=True),
        "results": rows,
    }


def row(s: Subject, tokens_per_step: int, steps: int, peak: float | None) -> dict:
    ms = statistics.median(s.round_s) / steps * 1e3
    tps = tokens_per_step / (ms / 1e3)
    return {
        "name": s.name, "options": s.options, "params": sum(p.numel() for p in s.model.parameters()),
        "ms_per_step": ms, "tokens_per_s": tps,
        "ms_per_step_rounds": [t / steps * 1e3 for t in s.round_s],
        # on a shared machine noise only adds time: the best round is the least disturbed one
        "ms_per_step_best": min(s.round_s) / steps * 1e3,
        "flops_per_token": s.flops_per_token,
        "mfu": tps * s.flops_per_token / peak if peak else None,
        "peak_mem_mb": s.peak_bytes / 2**20 if s.peak_bytes is not None else None,
        **({"eval": s.eval} if s.eval else {}),
    }


def render(result: dict):
    """The results as a rich table, for people."""
    from rich.table import Table

    shape = result["shape"]
    table = Table(title=(f"posenc bench — {result['device']}, {result['precision']}, "
                         f"{'compiled' if result['compile'] else 'eager'}, L={shape['n_layer']} "
                         f"H={shape['n_head']} d={shape['d_model']} B={shape['batch_size']} T={shape['seq_len']}"),
                  title_justify="left")
    for col in ("model", "tokens/s", "ms/step", "MFU", "peak mem", "vs nope", "vs reference"):
        table.add_column(col, justify="left" if col == "model" else "right")
    long = any("eval" in r for r in result["results"])
    if long:
        table.add_column("long eval", justify="right")

    def fmt(v, spec: str, suffix: str = "") -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{suffix}"

    for r in result["results"]:
        cells = [r["name"], fmt(r["tokens_per_s"], ",.0f"), fmt(r["ms_per_step"], ".1f"),
                 fmt(r["mfu"] and 100 * r["mfu"], ".1f", "%"), fmt(r["peak_mem_mb"], ",.0f", " MB"),
                 fmt(r["vs_nope"], ".3f", "×"), fmt(r["vs_reference"], ".3f", "×")]
        if long:
            e = r.get("eval")
            cells.append("—" if not e else e["status"] if e["status"] != "ok" else
                         f"{e['length']}: {e['seconds']:.2f}s" + (f", {e['peak_mem_mb']:,.0f} MB" if "peak_mem_mb" in e else ""))
        table.add_row(*cells)
    return table
