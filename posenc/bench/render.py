"""`posenc bench` results for people: a rich table on a terminal, one plain line per row in a log."""

from __future__ import annotations

import math

from rich.table import Table

from posenc.record import kernel_record
from posenc.record.metrics import MACHINE_CPUS, MACHINE_LOAD

#: "vs nope": the median of paired round-by-round ratios, their range, and nope's own tokens/s in
#: those rounds ("of 1,083"): the rate the ratio is of, taken under the same load as the row's own
#: tokens/s, whereas nope's row was measured at another time (and load: the "load" column)
COLUMNS = ("model", "tokens/s", "ms/step", "MFU", "peak mem", "warm-up", "load", "vs nope", "vs reference")
LEGEND = ("vs nope / vs reference: the median of round-by-round ratios to the baseline run alternately with the "
          "model (range), 'of N': the baseline's tokens/s in those same rounds, under the same load as the row's "
          "tokens/s; load: 1-min load average / CPUs when the row was done (a row's absolute figures depend on it)")


def _fmt(v, spec: str, suffix: str = "") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{suffix}"


def title(result: dict) -> str:
    shape = result["shape"]
    accum = f" ×{result['grad_accum']} accum" if result.get("grad_accum", 1) > 1 else ""
    return (f"posenc bench — {result['device']}, {result['precision']}, "
            f"{'compiled' if result['compile'] else 'eager'}, {recipe(result)}L={shape['n_layer']} H={shape['n_head']} "
            f"d={shape['d_model']} B={shape['batch_size']} T={shape['seq_len']}{accum}{masks(result)}")


def recipe(result: dict) -> str:
    """'recipe llama, ' (the block every row, the reference's included, is built with); '' in results
    written before the bench recorded it."""
    return f"recipe {result['recipe']}, " if result.get("recipe") else ""


def masks(result: dict) -> str:
    """', masks: documents + sliding 64 ×3 (hides 71%, skips 60% of blocks), …' where masks hide anything."""
    parts = []
    for m in result.get("masks") or []:
        if not m["documents"] and m["window"] == "global":
            continue
        what = " + ".join((["documents"] if m["documents"] else []) + ([m["window"]] if m["window"] != "global" else []))
        skipped = f", skips {m['blocks_skipped_pct']:.0f}% of blocks" if "blocks_skipped_pct" in m else ""
        parts.append(f"{what} ×{m['layers']} (hides {100 * m['hidden_fraction']:.0f}% of the causal scores{skipped})")
    return f", masks: {'; '.join(parts)}" if parts else ""


def long_eval_cell(e: dict | None) -> str:
    if not e:
        return "—"
    if e["status"] != "ok":
        return e["status"]
    return f"{e['length']}: {e['seconds']:.2f}s" + (f", {e['peak_mem_mb']:,.0f} MB" if "peak_mem_mb" in e else "")


def cells(r: dict) -> list[str]:
    """One row's cells, in COLUMNS order (a failed row: its name, then dashes)."""
    if r.get("status") == "failed":
        return [r["name"], *["—"] * (len(COLUMNS) - 1)]
    return [name_cell(r), _fmt(r["tokens_per_s"], ",.0f"), _fmt(r["ms_per_step"], ".1f"),
            _fmt(r["mfu"] and 100 * r["mfu"], ".1f", "%"), _fmt(r["peak_mem_mb"], ",.0f", " MB"),
            _fmt(r.get("warmup_s"), ".1f", " s"), load_cell(r.get("load")), ratio(r, "vs_nope"),
            ratio(r, "vs_reference")]


def name_cell(r: dict) -> str:
    """The row's model and, where one of its kernels fell back, the path it took and the step: 't5_bias ↓dense@1'."""
    marks = kernel_record.marks(r.get(kernel_record.KEY))
    return f"{r['name']} {marks}" if marks else r["name"]


def fallback_lines(result: dict) -> list[str]:
    """One line per fallback of any row, for under the table: its figures are not the fast path's."""
    return [f"{r['name']} fell back: {line}" for r in result["results"]
            for line in kernel_record.lines(r.get(kernel_record.KEY))]


def load_cell(load: dict | None) -> str:
    """The 1-minute load average when the row was done, over the CPUs: '3.2/2'."""
    if not load:
        return "—"
    return f"{load[MACHINE_LOAD.name]:.1f}/{load[MACHINE_CPUS.name]}"


def ratio(r: dict, key: str) -> str:
    """'0.912×' and, where rounds were paired, the range of the per-round ratios and the baseline's
    tokens/s in those rounds: '0.912× (0.90–0.93) of 1,083'."""
    spread, of = r.get(f"{key}_range"), r.get(f"{key}_of")
    if r.get(key) is None or not spread:
        return _fmt(r.get(key), ".3f", "×")
    text = f"{r[key]:.3f}×" + ("" if spread[0] == spread[1] else f" ({spread[0]:.2f}–{spread[1]:.2f})")
    return text + (f" of {of:,.0f}" if of is not None else "")


def table(result: dict) -> Table:
    """The rows measured so far as a rich table."""
    rows = result["results"]
    long = any("eval" in r for r in rows)
    failed = any(r.get("status") == "failed" for r in rows)
    t = Table(title=title(result), title_justify="left", caption=LEGEND, caption_justify="left")
    for col in COLUMNS:
        t.add_column(col, justify="left" if col == "model" else "right")
    if long:
        t.add_column("long eval", justify="right")
    if failed:
        t.add_column("note")
    for r in rows:
        extra = [long_eval_cell(r.get("eval"))] if long else []
        note = [f"failed: {r['error']}" if r.get("status") == "failed" else ""] if failed else []
        t.add_row(*cells(r), *extra, *note)
    return t


def line(r: dict) -> str:
    """One row as a plain line, for logs and pipes: `rope  tokens/s 12,345  ms/step 10.4  ...`."""
    if r.get("status") == "failed":
        return f"{r['name']}  failed: {r['error']}"
    parts = [f"{col} {cell}" for col, cell in zip(COLUMNS[1:], cells(r)[1:])]
    if "eval" in r:
        parts.append(f"long eval {long_eval_cell(r['eval'])}")
    return "  ".join([name_cell(r), *parts])


#: the decode table (``bench.decode=true``, posenc/bench/decode.py): one row per model and context
DECODE_COLUMNS = ("model", "context", "prefill tok/s", "decode tok/s", "cache/token", "vs full forward",
                  "vs reference", "the cache keeps")
DECODE_LEGEND = ("decoding, batch 1, eager: the context prefilled, then bench.decode_steps tokens one at a time; "
                 "vs full forward: decode tokens/s over a forward of the whole sequence per token, 'of N' its "
                 "tokens/s; vs reference: over the plain reference's KV cache; both medians of paired rounds "
                 "(range); cache/token: the bytes the layers keep per token [the reference's]")


def size(n: float | None) -> str:
    """Bytes in KiB or MiB: '12.0 KiB'."""
    if n is None:
        return "—"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def decode_cells(r: dict, cell: dict) -> list[str]:
    """One decode cell's row, in DECODE_COLUMNS order."""
    context = f"{cell['context']:,} ({cell['multiple']}×)"
    if cell["status"] != "ok":
        return [r["name"], context, cell["status"], *["—"] * (len(DECODE_COLUMNS) - 3)]
    bytes_cell = size(cell["cache_bytes_per_token"]) + (
        f" [{size(cell['reference_cache_bytes_per_token'])}]" if "reference_cache_bytes_per_token" in cell else "")
    path = cell["path"] + (f" (run again {cell['restarts']}× as it went stale)" if cell.get("restarts") else "")
    return [r["name"], context, _fmt(cell["prefill_tokens_per_s"], ",.0f"), _fmt(cell["decode_tokens_per_s"], ",.1f"),
            bytes_cell, ratio(cell, "vs_recompute"), ratio(cell, "vs_reference"), path]


def decode_table(result: dict) -> Table | None:
    """The decode cells measured so far, or None where the bench decodes nothing."""
    rows = [r for r in result["results"] if r.get("decode")]
    if not rows:
        return None
    t = Table(title="decoding", title_justify="left", caption=DECODE_LEGEND, caption_justify="left")
    for col in DECODE_COLUMNS:
        t.add_column(col, justify="left" if col in ("model", "the cache keeps") else "right")
    for r in rows:
        for cell in r["decode"]["contexts"]:
            t.add_row(*decode_cells(r, cell))
    return t


def decode_lines(r: dict) -> list[str]:
    """A row's decode cells as plain lines, for logs and pipes."""
    return ["  ".join([cells[0], *(f"{col} {c}" for col, c in zip(DECODE_COLUMNS[1:], cells[1:]))])
            for cells in (decode_cells(r, cell) for cell in (r.get("decode") or {}).get("contexts", []))]


def tables(result: dict) -> list[Table]:
    """The training table, and the decode table where the bench decodes."""
    return [table(result), *([t] if (t := decode_table(result)) is not None else [])]
