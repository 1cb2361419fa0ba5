"""Precision: the encoding's hooks in the run's training precision against float64, at the positions
its evaluation reaches.

Every other row runs in float64 on the check's 24 tokens, where a RoPE whose angles are computed in
the activations' dtype is exact; trained in bf16 its positions past 256 are rounded (8 bits of
mantissa) and its angles far more. These rows measure what the run computes: the model in float32
under the run's autocast (``trainer.precision``: bf16 and fp16 autocast run on a CPU; fp32 none), its
hooks given q and k in the activations' dtype (what a Linear returns under autocast) and the block's
input in float32 (the residual stream), over a window of the positions the run's evaluation reaches,
0..N-1 with N = max(eval.lengths) × trainer.seq_len (``Subject.longest``: 4096 by default). The
reference is the same encoding in float64 (a copy of the run's, made before any forward: its
parameters and buffers, cast; its caches computed in float64), given the same values. In
evaluation mode: positions past the training length are evaluation's.

- ``{p}: hooks = float64 up to position N``: each hook's output at the first and at the last
  ``WINDOW`` positions (a query-by-key term: those queries over every key they see) within the
  rounding of the activations' dtype, positions in float32 (results.rounding_bound): ROUNDING·(ε +
  ε_float32·m) of its magnitude at position m (a vector: its norm; a logit term: |b| + 1, a logit's
  own size; weights: the row's norm). The error at the last positions is measured against the bound
  there, so an error that grows with position fails where a dtype's rounding would not; where a
  hook fails, it is measured again in float32 (no autocast), which says in which dtype the error
  grows.
- ``{p}: rotary q·k depends on m − n only``: the same q and k at positions 0..W-1 and N-W..N-1, the
  scores q·k after transform_qk (computed in float64 from its outputs) equal within that bound of
  |q||k|.

Measured: embed, transform_qk, position_bias, decay (c_i − c_j), logit_scale, qk_scores and
normalise (posenc/check/hook_windows.py); content_bias (CoPE's, a term over every pair of the
window: N² of them) is not.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from posenc.check.hook_windows import B, HOOKS, WINDOW, computing, inputs, outputs, relative_error
from posenc.check.results import CheckResult, holds, not_offered, raised, rounding_bound
from posenc.check.subject import Subject
from posenc.hardware import PRECISIONS
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.mask import AttentionMask

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.float64: "float64"}


@dataclass(frozen=True)
class Gap:
    """One hook's relative error at the first and at the last positions, and the bounds there."""

    hook: str
    near: float
    far: float
    near_bound: float
    far_bound: float

    @property
    def ok(self) -> bool:
        return self.near <= self.near_bound and self.far <= self.far_bound


def names(s: Subject) -> tuple[str, str]:
    return (f"{s.precision}: hooks = float64 up to position {s.longest}",
            f"{s.precision}: rotary q·k depends on m − n only")


def precision_rows(s: Subject) -> list[CheckResult]:
    """Both rows in the run's precision (the module doc); a row whose hooks raise at the evaluation's
    positions (an index past a table that does not refuse them) is a ✗ naming the exception."""
    agree, relative = names(s)
    run, reference = encodings(s)
    dtype = PRECISIONS[s.precision]
    rows = []
    for name, row in ((agree, agreement), (relative, rotary_row)):
        try:
            rows.append(row(name, s, run, reference, dtype))
        except Exception as e:  # noqa: BLE001 - a hook that raises at those positions fails the row, with why
            failed = raised(name, e)
            rows.append(CheckResult(name, failed.status, failed.measured,
                                    f"at positions up to {s.longest - 1}: {failed.note}"))
    return rows


def agreement(name: str, s: Subject, run: list, reference: list, dtype: torch.dtype) -> CheckResult:
    """The hooks' row: each hook at the first and the last positions against float64."""
    gaps, refused = hook_gaps(run, reference, s.longest, dtype, s.precision)
    return agreement_row(name, s, run, reference, gaps, refused, dtype)


def rotary_row(name: str, s: Subject, run: list, reference: list, dtype: torch.dtype) -> CheckResult:
    """The rotary row: q·k at the last positions against the same q and k at the first."""
    rotary = [a for a in run if a[1].offers("transform_qk")]
    if not rotary:
        return not_offered(name, "no transform_qk")
    worst = max(rotary_shift_gap(a, s.longest, dtype, s.precision) for a in rotary)
    bound = rounding_bound(dtype, s.longest)
    far = f"{s.longest - WINDOW}..{s.longest - 1}"
    note = ""
    if worst > bound:
        wide = max(rotary_shift_gap(a, s.longest, torch.float32, "fp32") for a in rotary) \
            if dtype != torch.float32 else None
        note = (f"in {DTYPE_NAMES[dtype]} (trainer.precision={s.precision}) the scores at positions {far} differ from "
                f"those of the same q and k at 0..{WINDOW - 1} by {worst:.1e} of |q||k|, where its rounding allows "
                f"{bound:.1e}" + dtype_cause(dtype, wide, rounding_bound(torch.float32, s.longest), "transform_qk"))
    return holds(name, worst <= bound, f"max |Δ| {worst:.1e}·|q||k| (0..{WINDOW - 1} against {far}; ≤ {bound:.1e})",
                 note)


def dtype_cause(dtype: torch.dtype, in_float32: float | None, bound: float, hook: str) -> str:
    """What the second measurement, in float32 without autocast, says of an error measured in dtype."""
    if in_float32 is None:
        return ""
    if in_float32 <= bound:
        return (f"; in float32 it is {in_float32:.1e}: the error comes from {DTYPE_NAMES[dtype]} — {hook} computes "
                f"positions or angles in the dtype of the activations; compute them in float32 and cast the result")
    return f"; in float32 too ({in_float32:.1e})"


def encodings(s: Subject) -> tuple[list[tuple[int, PositionalEncoding]], list[tuple[int, PositionalEncoding]]]:
    """(layer, encoding) of each distinct encoding of the run's model (float32, as training builds it)
    and of the same model in float64 (a copy, before any forward: its parameters and buffers, cast),
    in evaluation mode."""
    run_model = s.model(dtype=torch.float32)
    reference = copy.deepcopy(run_model).double()
    out: tuple[list, list] = ([], [])
    for found, model in zip(out, (run_model, reference)):
        seen: set[int] = set()
        for layer in range(model.n_layer):
            e = model.encoding.for_layer(layer)
            if id(e) not in seen:
                seen.add(id(e))
                found.append((layer, e))
    return out


def hook_gaps(run: list, reference: list, N: int, dtype: torch.dtype, precision: str
              ) -> tuple[list[Gap], list[str]]:
    """Each hook's Gap, in the run's precision, for every layer encoding; the hooks that refuse
    position N - 1."""
    gaps, refused = [], []
    for (layer, a), (_, b) in zip(run, reference):
        given = inputs(a, N, dtype)
        got = outputs(a, layer, given, N, dtype, precision)
        expected = outputs(b, layer, given, N, None, None)
        suffix = f" (layer {layer})" if len(run) > 1 else ""
        refused += [hook + suffix for hook in HOOKS if a.offers(hook) and (hook not in got or hook not in expected)]
        for hook, (near, far, kind) in got.items():
            if hook in expected:
                e_near, e_far, _ = expected[hook]
                gaps.append(Gap(hook + suffix, relative_error(near, e_near, kind), relative_error(far, e_far, kind),
                                rounding_bound(dtype, WINDOW), rounding_bound(dtype, N)))
    return gaps, sorted(set(refused))


def agreement_row(name: str, s: Subject, run: list, reference: list, gaps: list[Gap], refused: list[str],
                  dtype: torch.dtype) -> CheckResult:
    """The hooks' row: measured the worst error at the first and the last positions; a failing
    hook's note with its error in float32 too (the dtype the error grows in)."""
    if not gaps:
        offered = [h for _, e in run for h in HOOKS if e.offers(h)]
        why = (f"{', '.join(refused)} refuse{'s' if len(refused) == 1 else ''} position {s.longest - 1}" if refused
               else "no hook takes positions" + (" (content_bias, over every pair of the window, is not measured)"
                                                  if any(e.offers("content_bias") for _, e in run) else ""))
        return not_offered(name, why if not offered or refused else "no hook measured")
    near = max(g.near for g in gaps)
    far = max(g.far for g in gaps)
    measured = (f"max rel. error {near:.1e} at 0..{WINDOW - 1}, {far:.1e} at {s.longest - WINDOW}..{s.longest - 1} "
                f"(≤ {gaps[0].near_bound:.1e}, {gaps[0].far_bound:.1e}; {', '.join(sorted({g.hook for g in gaps}))})")
    failing = [g for g in gaps if not g.ok]
    if not failing:
        return holds(name, True, measured)
    wide = {g.hook: g for g in hook_gaps(run, reference, s.longest, torch.float32, "fp32")[0]} \
        if dtype != torch.float32 else {}
    notes = []
    for g in failing:
        where = "grows with position" if g.far > g.far_bound and g.far > 4 * g.near else "exceeds its rounding"
        text = (f"the error of {g.hook} {where}: {g.near:.1e} of its magnitude at positions 0..{WINDOW - 1}, {g.far:.1e} at "
                f"{s.longest - WINDOW}..{s.longest - 1}, where rounding in {DTYPE_NAMES[dtype]} allows {g.near_bound:.1e} "
                f"and {g.far_bound:.1e} (trainer.precision={s.precision})")
        other = wide.get(g.hook)
        if other is not None:
            text += dtype_cause(dtype, other.far, other.far_bound, g.hook)
        notes.append(text)
    return holds(name, False, measured, "; ".join(notes))


def rotary_shift_gap(run: tuple[int, PositionalEncoding], N: int, dtype: torch.dtype, precision: str) -> float:
    """max |S_far − S_near| / (|q||k|): the same q, k at positions 0..W-1 and N-W..N-1, the scores
    formed in float64 from transform_qk's outputs in the precision."""
    layer, encoding = run
    g = torch.Generator().manual_seed(22)
    q, k = (torch.randn(B, encoding.n_head, WINDOW, encoding.head_dim, generator=g).to(dtype) for _ in "qk")
    whole = [torch.zeros(B, encoding.n_head, N, encoding.head_dim, dtype=dtype) for _ in "qk"]
    for t, part in zip(whole, (q, k)):
        t[..., :WINDOW, :] = part
        t[..., N - WINDOW:, :] = part
    ctx = Context.arange(N, dtype=torch.float32, masks=(AttentionMask(N),) * (layer + 1))
    with computing(precision):
        encoding.prepare(N)
        rq, rk = (t.double() for t in encoding.transform_qk(*whole, ctx, layer))
    near = rq[..., :WINDOW, :] @ rk[..., :WINDOW, :].transpose(-1, -2)
    far = rq[..., N - WINDOW:, :] @ rk[..., N - WINDOW:, :].transpose(-1, -2)
    scale = q.double().norm(dim=-1)[..., :, None] * k.double().norm(dim=-1)[..., None, :]
    return float(((far - near).abs() / scale.clamp_min(1e-30)).max())
