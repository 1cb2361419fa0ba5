"""Properties of the whole model around the encoding: what a causal LM must do whatever its
encoding is (causality, a sane loss at init, positions 0..T-1 by default), what document packing
and sliding windows promise, and what happens past the training length."""

from __future__ import annotations

import math

import torch

from posenc.check.length import length_readers, prefix_gaps
from posenc.check.results import EXACT, CheckResult, Status, holds, max_abs, not_offered
from posenc.check.subject import VOCAB, Subject
from posenc.errors import UserError
from posenc.nn.encodings.base import PositionOutOfRange

#: a change that must reach a logit moves it by more than this
REACHES = 1e-8
#: |loss at init - ln V| allowed: logits of std s add about s²/2 nats, so s up to about 1
INIT_LOSS_TOLERANCE = 0.5


def causality(s: Subject) -> list[CheckResult]:
    """The logits at t do not change when tokens t+1.. change (and the later ones do)."""
    model, x = s.model(), s.tokens()
    t = s.T // 2
    changed = x.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(x)[0], model(changed)[0]
    past, future = max_abs(a[:, : t + 1], b[:, : t + 1]), max_abs(a[:, t + 1:], b[:, t + 1:])
    return [holds("causal: the future reaches no past logit", past <= EXACT and future > REACHES,
                  f"max |Δ| {past:.1e}", "a token sees the tokens after it" if past > EXACT else
                  "changing the tokens after t changes nothing at all")]


def loss_at_init(s: Subject) -> list[CheckResult]:
    """Random tokens at init cost about ln V nats: the encoding does not blow up the logits."""
    model = s.model(visible=False)
    x, y = s.tokens(1, batch=4), s.tokens(2, batch=4)
    with torch.no_grad():
        loss = float(model(x, y)[1])
    gap = loss - math.log(VOCAB)
    return [holds(f"loss at init ≈ ln V ± {INIT_LOSS_TOLERANCE}", abs(gap) <= INIT_LOSS_TOLERANCE,
                  f"{loss:.3f} vs {math.log(VOCAB):.3f}", "the logits at init are far from uniform")]


def default_positions(s: Subject) -> list[CheckResult]:
    """model(x) equals model(x, pos=arange(T)): the default is positions 0..T-1."""
    model, x = s.model(), s.tokens()
    with torch.no_grad():
        diff = max_abs(model(x)[0], model(x, pos=torch.arange(s.T))[0])
    return [holds("default positions = 0..T−1", diff <= EXACT, f"max |Δ| {diff:.1e}",
                  "model(x) differs from model(x, pos=arange(T))")]


def spans(doc: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document after the first of each row of doc (B, T)."""
    out = []
    for row, ids in enumerate(doc.tolist()):
        starts = [i for i in range(1, len(ids)) if ids[i] != ids[i - 1]]
        out += [(row, a, b) for a, b in zip(starts, [*starts[1:], len(ids)])]
    return out


def documents(s: Subject) -> list[CheckResult]:
    """dataset.packing=documents: a document packed after others gives the same logits as alone.
    A chunked layer (Llama 4) cuts its chunks at window indices, which a packed document does not
    share with the document alone: it is checked as a sliding window of the same size here."""
    name = "documents: B after A = B alone"
    if not s.softmax:
        return [not_offered(name, "linear attention has no mask to keep documents apart")]
    sliding = {f"layout.kinds.{k}.chunked": False for k, kind in s.cfg.layout.kinds.items() if kind.chunked}
    model, x, doc = s.model(cfg=s.with_changes(**sliding) if sliding else None), s.tokens(), s.documents()
    worst = 0.0
    with torch.no_grad():
        packed = model(x, doc=doc)[0]
        for row, a, b in spans(doc):
            alone = model(x[row:row + 1, a:b])[0]
            worst = max(worst, max_abs(packed[row:row + 1, a:b], alone))
    note = "" if worst <= EXACT else documents_cause(s, model, x, doc, packed)
    return [holds(name, worst <= EXACT, f"max |Δ| {worst:.1e}", note)]


def documents_cause(s: Subject, model, x: torch.Tensor, doc: torch.Tensor, packed: torch.Tensor) -> str:
    """Why a packed document's logits differ from the document's alone, from what is measured: a
    change to each row's first document reaching the others (a leak across documents), else the
    window's length reaching the logits (the prefix row: a packed document sits in a longer
    window than alone), else positions that do not restart at 0."""
    changed = x.clone()
    changed[doc == doc[:, :1]] = (changed[doc == doc[:, :1]] + 1) % VOCAB  # every row's first document
    with torch.no_grad():
        after = model(changed, doc=doc)[0]
    later = doc != doc[:, :1]
    leak = max_abs(packed[later], after[later])
    if leak > EXACT:
        return f"a document sees another: changing each row's first document moves the later ones' logits by {leak:.1e}"
    if max(prefix_gaps(s).values()) > EXACT:
        readers = length_readers(s)
        reader = f" ({', '.join(readers)} {'reads' if len(readers) == 1 else 'read'} it)" if readers else ""
        return (f"no document sees another, but the logits depend on the window's length{reader}, and a packed "
                f"document sits in a longer window than alone: see the prefix row")
    return ("no document sees another and the window's length reaches no logit, so a document's positions differ "
            "from its own: they must restart at 0 in every document (use ctx.pos, not window indices)")


def windows(s: Subject, window: int = 4) -> list[CheckResult]:
    """Every layer sliding with a window w: through L layers the token L·(w-1+r) back reaches the
    last logit, the one before it does not (r: the encoding's declared ``reach`` behind the oldest
    key, 0 unless a hook reads tokens outside the window, as PaTH's short convolution does)."""
    if not s.softmax:
        return [not_offered("windows: nothing beyond L·(w−1)", "linear attention has no mask to limit to a window")]
    recurrent = [k for k, kind in s.cfg.layout.kinds.items() if kind.get("mixer", "softmax") != "softmax"]
    if recurrent:  # a recurrent layer carries a state of the whole past: no window bounds what reaches a logit
        return [not_offered("windows: nothing beyond L·(w−1)", f"layer kind {recurrent[0]} is recurrent: its state "
                            "holds the whole past, no window applies")]
    kinds = {f"layout.kinds.{k}.window": window for k in s.cfg.layout.kinds}
    chunks = {f"layout.kinds.{k}.chunked": False for k in s.cfg.layout.kinds}
    model = s.model(cfg=s.with_changes(**kinds, **chunks))
    L, reach = int(s.cfg.model.n_layer), model.encoding.reach
    span = L * (window - 1 + reach)
    name = f"windows: nothing beyond L·(w−1{f'+{reach}' if reach else ''}) = {span}"
    x, i = s.tokens(), s.T - 1
    edge = i - span
    diffs = []
    for where in (edge - 1, edge):
        changed = x.clone()
        changed[:, where] = (changed[:, where] + 1) % VOCAB
        with torch.no_grad():
            diffs.append(max_abs(model(x)[0][:, i], model(changed)[0][:, i]))
    beyond, inside = diffs
    return [holds(name, beyond <= EXACT and inside > REACHES, f"beyond {beyond:.1e}, edge {inside:.1e}",
                  "a token beyond the windows reaches the logit" if beyond > EXACT else
                  "the oldest token the windows reach changes nothing")]


def past_training(s: Subject, factor: int = 4) -> list[CheckResult]:
    """At factor × T the model either evaluates (a finite loss) or refuses with one line."""
    name = f"{factor}× the training length: runs or refuses"
    model = s.model(visible=False)
    n = factor * s.T
    x, y = s.tokens(3, batch=1, T=n), s.tokens(4, batch=1, T=n)
    try:
        with torch.no_grad():
            loss = float(model(x, y)[1])
    except (PositionOutOfRange, UserError) as e:
        message = str(e).strip()
        if "\n" in message:
            return [holds(name, False, f"refused ({type(e).__name__})", "the refusal is more than one line")]
        return [CheckResult(name, Status.PASS, f"refused ({type(e).__name__})", message)]
    return [holds(name, math.isfinite(loss), f"loss {loss:.3f} at {n} tokens", "the loss is not finite")]
