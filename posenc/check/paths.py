"""Every attention path equals the float64 reference (reference.py) built from the encoding's own
hooks; the three forms of a position bias agree; a relative encoding is shift-invariant.

Each layer kind's encoding (``for_layer``: a layout may give kinds their own) is checked on its
own q, k, v, under five masks: causal, documents, a sliding window, documents and a window,
documents and chunks. The paths are those posenc/nn/attention.py chooses between: SDPA's
is_causal fast path, SDPA with a dense explicit mask (the bias and every logit term folded in),
the chunked path of long evaluation (chunks of 5 queries, which do not divide T) and
FlexAttention (its eager forward here, under one mask; compiled, with its backward, in cuda.py).
Paths and bias forms are measured with the encodings in evaluation and in training (an encoding may
compute its hooks otherwise in training); shift invariance, what declares an encoding relative, in
evaluation.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor

from posenc.check import reference as ref
from posenc.check.hooks import layer_encodings
from posenc.check.results import CheckResult, Measured, holds, in_modes, max_abs, not_offered, rounding_bound
from posenc.check.subject import MODE_NAMES, MODES, Subject
from posenc.nn import attention, flex
from posenc.nn.encodings.base import Context, PositionalEncoding
from posenc.nn.kernels import KernelPolicy
from posenc.nn.mask import AttentionMask, Window, document_positions

#: float64 attention outputs of two paths agree to this
TOLERANCE = 1e-10
#: the masks every path is checked under: (documents?, window)
MASKS = {"causal": (False, Window()), "documents": (True, Window()), "sliding 5": (False, Window(5)),
         "documents+sliding 5": (True, Window(5)), "documents+chunks of 4": (True, Window(4, chunked=True))}
#: the one mask FlexAttention's eager forward is checked under on a CPU: each call traces the
#: kernel anew (seconds), and this mask has all three pieces (causal, documents, window)
FLEX_MASK = "documents+sliding 5"
#: query rows per chunk in the chunked path: not a divisor of T, so a chunk ends mid-document
CHUNK = 5
#: heads and head dimension of the q, k, v the paths are fed
H, B = 4, 2


@dataclasses.dataclass
class Case:
    """One encoding, one mask: the encoded q, k, terms and the reference output."""

    encoding: PositionalEncoding
    layer: int
    ctx: Context
    mask: AttentionMask
    q: Tensor
    k: Tensor
    v: Tensor
    terms: attention.LayerTerms
    expected: Tensor


def cases(s: Subject, mode: str = "eval") -> Iterator[tuple[str, Case]]:
    """(mask, Case) for each layer encoding (in mode) under each of MASKS."""
    T, doc = s.T, s.documents()
    for layer, encoding in layer_encodings(s, mode):
        hd = encoding.head_dim
        for label, (documents, window) in MASKS.items():
            d = doc if documents else None
            pos = document_positions(doc) if documents else torch.arange(T)
            mask = AttentionMask(T, d, window)
            ctx = Context.at(pos, torch.float64, d, (mask,) * (layer + 1), n_positions=T) if documents else \
                Context.arange(T, dtype=torch.float64, masks=(mask,) * (layer + 1))
            g = torch.Generator().manual_seed(1)
            q, k, v = (torch.randn(B, encoding.n_head, T, hd, generator=g, dtype=torch.float64) for _ in range(3))
            x = torch.randn(B, T, encoding.d_model, generator=g, dtype=torch.float64)  # the block's input (FoX)
            encoding.prepare(T)
            with torch.no_grad():
                q, k, terms = attention.encode(encoding, q, k, ctx.with_input(x), layer)
                extra = encoding.position_bias(pos, pos).double() if encoding.offers("position_bias") else None
                expected = ref.reference(q, k, v, ref.visible(T, d, window, B), extra, terms)
            yield label, Case(encoding, layer, ctx, mask, q, k, v, terms, expected)


def flex_offered(encoding: PositionalEncoding, ctx: Context) -> str | None:
    """Why FlexAttention does not run this encoding, or None where it does (attention.plan's rules)."""
    if not flex.AVAILABLE:
        return "this torch has no FlexAttention"
    if encoding.offers("content_bias"):
        return "a content bias joins the dense mask"
    if encoding.offers("normalise"):
        return "the encoding replaces softmax"
    if encoding.offers("qk_scores"):
        return "the encoding replaces q·k, which no fused kernel computes"
    if encoding.offers("position_bias") and encoding.score_mod(ctx) is None:
        return "the position bias has no score_mod"
    return None


#: the paths attention_paths measures, as its rows name them
PATHS = {"sdpa": "SDPA is_causal = reference", "dense": "dense mask = reference",
         "chunked": "chunked (long eval) = reference", "flex": "FlexAttention forward = reference"}


def attention_paths(s: Subject) -> list[CheckResult]:
    """SDPA is_causal, the dense mask, the chunked path and FlexAttention's forward, each equal to
    the reference, under every mask the encoding meets, in each mode."""
    found: dict[str, dict[str, Measured]] = {key: {} for key in PATHS}
    why_not_flex, policy = None, KernelPolicy()  # the check's own: what it plans is no run's
    for mode in MODES:
        errors: dict[str, list[tuple[float, str]]] = {key: [] for key in PATHS}
        for label, c in cases(s, mode):
            where = f"under the mask {label}" + (f", layer {c.layer}" if c.layer else "")
            with torch.no_grad():
                plan = attention.plan(c.encoding, c.ctx, c.layer, 0.0, policy)
                errors["sdpa" if plan is None else "dense"].append(
                    (max_abs(attention.attend(c.q, c.k, c.v, plan, terms=c.terms), c.expected), where))
                dense = attention.dense_plan(c.encoding, c.ctx, c.layer)
                long = dataclasses.replace(dense, dense=None)  # rows computed chunk by chunk, as past DENSE_MAX_LEN
                errors["chunked"].append((max_abs(attention.attend(c.q, c.k, c.v, long, terms=c.terms,
                                                                   query_chunk=CHUNK), c.expected), where))
                bias_ctx = attention.bias_context(c.encoding, c.ctx)
                why_not_flex = flex_offered(c.encoding, bias_ctx)
                if why_not_flex is None and label == FLEX_MASK:
                    errors["flex"].append((max_abs(flex_forward(c, bias_ctx), c.expected), where))
        for key, errs in errors.items():
            if errs:
                (worst, where), masks = max(errs), f"{len(errs)} mask{'s' if len(errs) > 1 else ''}"
                found[key][mode] = Measured(worst <= TOLERANCE, f"max |Δ| {worst:.1e}, {masks}",
                                            f"{where} it differs from the reference by {worst:.1e}: "
                                            f"{path_cause(s, key)}")
    why = {"sdpa": "logit terms go through the dense mask", "flex": why_not_flex or ""}
    return [in_modes(name, found[key], MODE_NAMES) if found[key] else not_offered(name, why.get(key, ""))
            for key, name in PATHS.items()]


def path_cause(s: Subject, path: str) -> str:
    """Why a path differs from the reference, where it can be measured: the chunked path asks
    position_bias for a slice of queries and the keys they see, so a bias that reads how many
    positions it is given (the window's length) differs there and nowhere else."""
    if path == "chunked":
        for _, encoding in layer_encodings(s):
            gap, (start, end) = bias_slice_gap(encoding, s.T)
            if gap > TOLERANCE:
                return (f"position_bias of queries {start}..{end - 1} and keys 0..{end - 1} (a slice, as long evaluation "
                        f"asks for it) differs from that slice of the whole window's bias by {gap:.1e}: it reads how many "
                        f"positions it is given — compute b(i, j) from the values of q_pos and k_pos alone")
    return "this path computes other attention than the encoding's hooks define"  # no second measurement isolates more


def bias_slice_gap(encoding: PositionalEncoding, T: int) -> tuple[float, tuple[int, int]]:
    """The largest max |Δ| on visible pairs between position_bias of a chunk of CHUNK queries with
    the keys before them and that block of the whole window's bias, and that chunk (start, end);
    (0, (0, 0)) for an encoding without a position bias."""
    if not encoding.offers("position_bias"):
        return 0.0, (0, 0)
    pos = torch.arange(T)
    encoding.prepare(T)
    worst, where = 0.0, (0, 0)
    with torch.no_grad():
        whole = encoding.position_bias(pos, pos).double()  # (H, T, T)
        for start in range(0, T, CHUNK):
            end = min(start + CHUNK, T)
            seen = torch.arange(start, end)[:, None] >= torch.arange(end)[None, :]  # (rows, keys) j <= i
            part = encoding.position_bias(pos[start:end], pos[:end]).double()
            gap = max_abs(part[..., seen], whole[..., start:end, :end][..., seen])
            if gap > worst:
                worst, where = gap, (start, end)
    return worst, where


def flex_forward(c: Case, bias_ctx: Context) -> Tensor:
    """FlexAttention's eager forward with the encoding's score_mod and the mask's BlockMask."""
    score_mod = c.encoding.score_mod(bias_ctx) if c.encoding.offers("position_bias") else None
    plan = flex.FlexPlan(score_mod, c.mask.block_mask(torch.device("cpu")), eager=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is slow: it is a check
        return plan.attend(c.q, c.k, c.v, c.terms.decay, c.terms.sink)


def bias_forms(s: Subject) -> list[CheckResult]:
    """score_mod(0, b, h, i, j) = position_bias[h, i, j] on every visible pair, with positions 0..T-1
    and shifted by 5, the score_mod built with and without gradients (training may build it otherwise:
    FIRE's table); a relative encoding's distance_bias table[h, i - j] = position_bias[h, i, j]; the
    encodings in each mode."""
    name = "score_mod = position_bias = distance_bias"
    found, forms = {}, set()
    for mode in MODES:
        worst, where = 0.0, ""
        for layer, encoding in layer_encodings(s, mode):
            if encoding.offers("position_bias"):
                for gap, form in bias_form_gaps(encoding, s.T):
                    forms.add(form.split(" ")[0])
                    if gap > worst:
                        worst, where = gap, form + (f", layer {layer}" if layer else "")
        found[mode] = Measured(worst <= TOLERANCE, f"max |Δ| {worst:.1e}",
                               f"{where} differs from position_bias by {worst:.1e} (FlexAttention's kernel computes "
                               f"the bias from it, the CPU and long evaluation from position_bias)")
    if not forms:
        return [not_offered(name, "no position bias" if not any(e.offers("position_bias") for _, e in layer_encodings(s))
                            else "position_bias has neither a score_mod nor a distance_bias")]
    row = in_modes(name, found, MODE_NAMES)
    return [dataclasses.replace(row, measured=f"{row.measured} ({', '.join(sorted(forms, reverse=True))})")]


def bias_form_gaps(encoding: PositionalEncoding, T: int) -> Iterator[tuple[float, str]]:
    """(max |Δ| on visible pairs against position_bias, which form where) of each form the encoding
    offers: its score_mod built without and with gradients, its distance_bias table, at positions
    0..T-1 and shifted by 5."""
    h, i, j = (torch.arange(n).view(*shape) for n, shape in
               ((encoding.n_head, (-1, 1, 1)), (T, (1, -1, 1)), (T, (1, 1, -1))))
    seen = (j <= i).expand(encoding.n_head, T, T)
    for shift in (0, 5):
        pos = torch.arange(T) + shift
        ctx = Context.arange(T, dtype=torch.float64) if shift == 0 else Context.at(pos, torch.float64)
        at = f"positions {'0..T−1' if shift == 0 else f'shifted by {shift}'}"
        encoding.prepare(ctx.n_positions)
        with torch.no_grad():
            bias = encoding.position_bias(pos, pos).double()  # (H, T, T)
        for grad in (False, True):  # an encoding may build its score_mod otherwise for training (FIRE)
            with torch.set_grad_enabled(grad):
                mod = encoding.score_mod(ctx)
            if mod is not None:
                with torch.no_grad():
                    fly = mod(torch.zeros(encoding.n_head, T, T, dtype=torch.float64), torch.tensor(0), h, i, j)
                yield max_abs(fly[seen], bias[seen]), f"score_mod (built {'with' if grad else 'without'} gradients, {at})"
        if encoding.offers("distance_bias"):
            with torch.no_grad():
                table = encoding.distance_bias(torch.arange(T)).double()  # (H, T)
            yield (max_abs(table[h, (i - j).clamp(min=0)].expand_as(bias)[seen], bias[seen]),
                   f"distance_bias at i − j ({at})")


def shift_invariance(s: Subject, shift: int = 37) -> list[CheckResult]:
    """A relative bias (distance_bias offered) and rotary scores q·k after transform_qk depend on
    positions only through i - j: shifting every position changes neither, beyond the rounding of a
    float64 computation whose positions and angles may be float32 (results.rounding_bound at the
    largest position: 2.9e-5 of |q||k| for the scores, of |b| + 1 for the bias)."""
    T = s.T
    pos = torch.arange(T)
    n = T + shift  # one bound for both, so a length-dependent scaling sees the same length
    bias_worst, score_worst, biased, rotary = 0.0, 0.0, False, False
    g = torch.Generator().manual_seed(4)
    for _, encoding in layer_encodings(s):
        if not (encoding.offers("distance_bias") or encoding.offers("transform_qk")):
            continue
        encoding.prepare(n)
        with torch.no_grad():
            if encoding.offers("distance_bias"):
                biased = True
                before = encoding.position_bias(pos, pos).double()
                after = encoding.position_bias(pos + shift, pos + shift).double()
                bias_worst = max(bias_worst, float(((after - before).abs() / (before.abs() + 1.0)).max()))
            if encoding.offers("transform_qk"):
                rotary = True
                q, k = (torch.randn(B, encoding.n_head, T, encoding.head_dim, generator=g, dtype=torch.float64)
                        for _ in range(2))
                scores = []
                for p in (pos, pos + shift):
                    tq, tk = encoding.transform_qk(q, k, Context.at(p, torch.float64, n_positions=n), 0)
                    scores.append(tq @ tk.transpose(-1, -2))
                norms = q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :]  # |q_m||k_n|
                score_worst = max(score_worst, float(((scores[0] - scores[1]).abs() / norms).max()))
    rows = []
    bound = rounding_bound(torch.float64, n)  # float64, positions and angles in float32 at least
    name = "bias depends on i − j only"
    has_bias = any(e.offers("position_bias") for _, e in layer_encodings(s))
    rows.append(holds(name, bias_worst <= bound, f"max |Δ| {bias_worst:.1e}·(|b| + 1) (+{shift}; ≤ {bound:.1e})",
                      "distance_bias is offered, so the bias must depend on i − j alone") if biased else
                not_offered(name, "the position bias offers no distance_bias, so may depend on i and j apart"
                            if has_bias else "no position bias"))
    name = "rotary q·k depends on m − n only"
    rows.append(holds(name, score_worst <= bound, f"max |Δ| {score_worst:.1e}·|q||k| (+{shift}; ≤ {bound:.1e})",
                      "scores change when every position shifts: transform_qk is not relative") if rotary else
                not_offered(name, "no transform_qk"))
    return rows
