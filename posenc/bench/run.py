"""`posenc bench`: what each encoding costs per training step, at one shape, on this machine.

For the plain reference (reference.py), then ``nope``, then every other encoding of
``bench.encodings``, one after another: build it as training does, time its train_step
(timing.py), measure its memory (memory.py), and hand its row to the listener at once, so a
long bench shows each row as soon as it is measured. The baselines go first and stay built:
each later model's timed rounds alternate with a round of each baseline, so its ratios
(``vs_nope``, ``vs_reference``: the median of the per-round ratios, with their range) are
taken under the same load, and the row carries them when it appears. The machine's load
average is recorded at the start and after every row (``load``); the CLI warns when it was high. An encoding that
fails (beyond its max_len, out of memory, a kernel error) leaves a row that says why, and
the others are still measured.

FLOPs/token = 6N + 12·L·d·T (PaLM, appendix B); MFU = tokens/s · FLOPs/token / peak FLOP/s.
"""

from __future__ import annotations

import functools
import gc
import resource
import statistics
from collections.abc import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from posenc.bench.estimate import (
    QUICK,
    choose_preset,
    estimate_line,
    model_steps,
    preset,
    presets_of,
)
from posenc.bench.masks import bench_batch, mask_summary
from posenc.bench.memory import long_eval, step_peak_bytes
from posenc.bench.plan import (
    ALL,
    BASELINES,
    check_encoding_overrides,
    chose_encodings,
    encoding_config,
    order_of,
    select_encodings,
    validate,
)
from posenc.bench.decode import decode_costs, reference_decoder
from posenc.bench.reference import REFERENCE, PlainGPT, recipe_of
from posenc.bench.timing import FixedBatch, Subject, build_subject, rate, time_subject
from posenc.build import build_tokenizer
from posenc.config import group_options
from posenc.errors import UserError
from posenc.hardware import machine_load, peak_flops, setup_device, use_compile
from posenc.nn.encodings.base import PositionOutOfRange

#: said when nope is not benched: the "vs nope" column pairs each row with nope alone
NO_NOPE = ("vs nope stays — : nope is not among the encodings, and it is the only encoding rows are paired with "
           "(besides the reference) — add it (encoding=…,nope) to time every row against it")


class Listener:
    """What the caller hears while the bench runs (the CLI prints, writes JSON); no-ops here."""

    def started(self, result: dict) -> None:
        """The header is known (device, shape, ...), no row yet."""

    def progress(self, what: str) -> None:
        """What is being done now: 'warming up rope'."""

    def note(self, text: str) -> None:
        """A line to keep: the plan, and after the first model the estimate of the rest."""

    def row(self, result: dict) -> None:
        """A row was appended to result['results'] (the last one)."""


def bench(overrides: list[str], listener: Listener | None = None) -> dict:
    """Time every encoding (and the reference) at one shape; return the JSON-ready results."""
    listener = listener or Listener()
    listener.progress("composing the config")
    asked = len(overrides)
    overrides, chosen = choose_preset(overrides)  # on a CPU, bench=quick unless the user chose
    defaulted = len(overrides) != asked
    explicit = chose_encodings(overrides)  # encoding=… or bench.encodings=…, not the preset's list
    names, overrides, cfg = select_encodings(overrides)
    b = cfg.bench
    validate(b)
    check_encoding_overrides(overrides, names)
    listener.progress("setting up the device and the tokenizer")
    device, precision, autocast = setup_device(cfg.device, cfg.trainer.precision)  # as train, eval, probe
    vocab = build_tokenizer(cfg).vocab_size
    B, T = int(b.batch_size), int(b.seq_len)
    torch.manual_seed(cfg.seed)
    batch = FixedBatch(bench_batch(vocab, B, T, b.get("document_length")))  # on the host: train_step moves it
    peak = peak_flops(device, b.peak_flops)
    order = order_of(names, bool(b.reference))
    result = header(cfg, device, precision, batch, peak, chosen, order)
    listener.started(result)
    picked = names if explicit else None
    presets = {**presets_of(overrides, picked), chosen: preset(cfg, names)}
    listener.note(plan_line(order, b, chosen, defaulted, picked is None))
    if "nope" not in order:
        listener.note(NO_NOPE)
    baselines: list[Subject] = []  # kept built: every later model's rounds alternate with theirs
    decoder = reference_decoder(cfg, vocab, device) if b.decode and b.reference else None
    try:
        for done, name in enumerate(order, 1):
            config = (lambda: cfg) if name == REFERENCE else functools.partial(encoding_config, overrides, name)
            row, subject = measure(name, config, vocab, batch, device, autocast, peak, listener, baselines,
                                   f"model {done} of {len(order)}", decoder)
            if subject is not None:
                baselines.append(subject)
            result["results"].append(row)
            result["process_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            result["load"].append(machine_load())
            row["load"] = result["load"][-1]  # the load its rounds ran under: absolute figures depend on it
            if name in BASELINES and any(n in BASELINES for n in order[done:]):
                continue  # the first baseline's row waits for the second's: both come from the same rounds
            time_baselines_together(result["results"])
            add_ratios(result["results"])
            listener.row(result)
            if "estimate" not in result and row["status"] == "ok" and done < len(order):
                result["estimate"] = estimate_line(BASELINES, done, row["ms_per_step"] / 1e3, chosen, presets)
                listener.note(result["estimate"])
    finally:
        baselines.clear()
        free(device)
    return result


def header(cfg: DictConfig, device: torch.device, precision: str, batch: FixedBatch, peak: float | None,
           chosen: str, order: list[str]) -> dict:
    """The result before any row: device, shape, timing, masks, the models planned, the load."""
    b = cfg.bench
    B, T = int(b.batch_size), int(b.seq_len)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "compile": use_compile(cfg.trainer.compile, device), "torch": torch.__version__,
        "recipe": recipe_of(cfg.model).name,  # every model's block, the plain reference's included
        "shape": {**{k: cfg.model[k] for k in ("n_layer", "n_head", "d_model")}, "batch_size": B, "seq_len": T},
        "grad_accum": int(cfg.trainer.grad_accum),
        "steps": b.steps, "warmup": b.warmup, "rounds": b.rounds, "peak_flops": peak,
        "memory_method": ("torch.cuda.max_memory_allocated over one step + params, grads, optimizer state"
                          if device.type == "cuda" else
                          "params + grads + optimizer state + tensors saved for backward (CPU estimate)"),
        "process_max_rss_mb": None,
        "config": OmegaConf.to_container(b, resolve=True), "preset": chosen,
        # what the masks hide (documents, the layout's windows), and on CUDA the blocks skipped
        "masks": mask_summary(cfg, batch.batch, device),
        "load": [machine_load()],  # at the start, then after each row: {machine/load_1min, machine/cpus}
        "planned": order,  # an interrupted bench says how many of them it measured
        "results": [],
    }


def plan_line(order: list[str], b: DictConfig, chosen: str, defaulted: bool, preset_list: bool) -> str:
    """'bench=quick (the CPU default): 7 models (6 of 22 encodings, the preset's list: encoding=all
    for every one), 122 training steps; an estimate follows the first rows …'."""
    planned = sum(model_steps(order, BASELINES, b.warmup, b.steps, b.rounds))
    other = "bench=default for the full bench" if chosen == QUICK else "bench=quick for a first look"
    encodings = [n for n in order if n != REFERENCE]
    every = len(group_options("encoding"))
    which = (f" ({len(encodings)} of {every} encodings, the preset's list: encoding={ALL} for every one)"
             if preset_list and len(encodings) < every else "")
    return (f"bench={chosen}{' (the CPU default)' if defaulted else ''}: {len(order)} models{which}, "
            f"{planned:,} training steps; an estimate follows the first rows ({other})")


def measure(name: str, config: Callable[[], DictConfig], vocab: int, batch: FixedBatch, device: torch.device,
            autocast, peak: float | None, listener: Listener, baselines: list[Subject],
            which: str = "", decoder: PlainGPT | None = None) -> tuple[dict, Subject | None]:
    """One row: speed (rounds alternating with the baselines'), memory and (if asked) a long
    forward and the decoding cost of one model (decoder: the reference's, its third arm); a failure
    (its config included) is a row too. Returns the row, and the subject when it is a baseline to keep
    for the later rows. which: 'model 3 of 7', for progress."""
    subject, keep = None, False
    at = f" ({which})" if which else ""
    try:
        listener.progress(f"building {name}{at}")
        cfg = config()
        b = cfg.bench
        subject = build_subject(name, cfg, vocab, batch, device, autocast)
        listener.progress(f"compiling and warming up {name}{at}" if use_compile(cfg.trainer.compile, device)
                          else f"warming up {name}{at}")
        with_others = f", each round then one of {' and '.join(o.name for o in baselines)}" if baselines else ""
        timing = time_subject(subject, b.warmup, b.steps, b.rounds, others=baselines,
                              on_round=lambda r: listener.progress(f"timing {name}{at}: round {r} of {b.rounds} "
                                                                   f"({b.steps} steps{with_others})"))
        listener.progress(f"memory of {name}{at}")
        peak_bytes = step_peak_bytes(subject.state)
        row = {"name": name, "status": "ok", "options": subject.options,
               "params": sum(p.numel() for p in subject.state.model.parameters()),
               **rate(timing, b.steps, subject.flops_per_token, peak),
               "flops_per_token": subject.flops_per_token, "peak_mem_mb": peak_bytes / 2**20,
               "kernels": subject.state.kernels.record()}  # how it ran: paths, compiled, fallbacks
        if b.eval_length_multiple and name != REFERENCE:
            listener.progress(f"{b.eval_length_multiple}x length eval of {name}{at}")
            row["eval"] = long_eval(subject.state.model, device, autocast, vocab, int(b.seq_len * b.eval_length_multiple))
        if b.decode and name != REFERENCE:
            row["decode"] = decode_costs(subject.state.model, decoder, vocab, b, device, autocast,
                                         lambda what: listener.progress(f"{name}{at}: {what}"))
        keep = name in BASELINES
        return row, subject if keep else None
    except Exception as e:  # noqa: BLE001 - one encoding's failure must not cost the others' rows
        return {"name": name, "status": "failed", "error": reason(e)}, None
    finally:
        if not keep:
            del subject  # free this model's parameters and optimizer state before the next model
            free(device)


def free(device: torch.device) -> None:
    """Return the memory of models no longer referenced (the allocator's cache too, on CUDA)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reason(e: Exception) -> str:
    """Why a row failed, in one line."""
    if isinstance(e, torch.OutOfMemoryError):
        return "out of memory — use a smaller bench.batch_size or model"
    first = (str(e).strip().splitlines() or [""])[0]
    return first if isinstance(e, (UserError, PositionOutOfRange)) else f"{type(e).__name__}: {first}"


def time_baselines_together(rows: list[dict]) -> None:
    """The reference's rate from its rounds alternating with nope's, not from its own first rounds.

    The reference is timed first, alone, while the process and the machine are still warming up;
    nope's rounds then alternate with a round of the reference each. Its row takes the rate of
    those paired rounds (its rounds alone are kept under ``timed_alone``), so the two baselines'
    rows come from the same seconds and read as their paired ratio says (the reference at
    1,245 tokens/s and nope at 3,527, yet nope 1.581× the reference)."""
    by_name = {r["name"]: r for r in rows if r["status"] == "ok"}
    reference, nope = by_name.get(REFERENCE), by_name.get("nope")
    if reference is None or nope is None or "timed_alone" in reference or not nope.get("paired", {}).get(REFERENCE):
        return
    ratios = nope["paired"][REFERENCE]  # the reference's round time over nope's, round by round
    rounds = [r * ms for r, ms in zip(ratios, nope["ms_per_step_rounds"])]
    keys = ("tokens_per_s", "ms_per_step", "ms_per_step_rounds", "ms_per_step_best", "mfu")
    reference["timed_alone"] = {k: reference[k] for k in keys}
    scale = reference["ms_per_step"] / statistics.median(rounds)  # tokens/s and MFU scale as 1 / ms
    reference.update({"ms_per_step": statistics.median(rounds), "ms_per_step_rounds": rounds,
                      "ms_per_step_best": min(rounds), "tokens_per_s": reference["tokens_per_s"] * scale,
                      "mfu": reference["mfu"] and reference["mfu"] * scale, "timed_with": "nope"})


def add_ratios(rows: list[dict]) -> None:
    """Throughput relative to nope and to the reference, for every row measured so far: the
    median of the round-by-round ratios (``vs_nope``), their range (``vs_nope_range``) and the
    baseline's tokens/s in those rounds (``vs_nope_of``) where the rounds were paired, the ratio of
    the two medians otherwise (a baseline against itself; the reference's vs_nope, filled in once
    nope is measured, from nope's pairing)."""
    by_name = {r["name"]: r for r in rows if r["status"] == "ok"}
    for row in rows:
        for other, key in (("nope", "vs_nope"), (REFERENCE, "vs_reference")):
            row[key], row[f"{key}_range"], row[f"{key}_of"] = None, None, None
            if row["status"] != "ok" or other not in by_name:
                continue
            mine, theirs = row.get("paired", {}).get(other), by_name[other].get("paired", {}).get(row["name"])
            ratios = mine or [1 / r for r in theirs or []]
            if ratios:
                row[key], row[f"{key}_range"] = statistics.median(ratios), [min(ratios), max(ratios)]
                # the baseline's tokens/s in those same rounds (its own median where it was the one paired)
                row[f"{key}_of"] = (row["paired_tokens_per_s"][other] if mine
                                    else by_name[other]["tokens_per_s"])
            else:
                row[key] = row["tokens_per_s"] / by_name[other]["tokens_per_s"]
