"""Properties of the whole model around the encoding: what a causal LM must do whatever its
encoding is (causality, a sane loss at init, positions 0..T-1 by default, each sequence of a batch
computed on its own), what document packing and sliding windows promise, and what happens past
the training length.

Each is measured in evaluation and in training (subject.MODES) but the last, which only evaluation
asks. Documents in training: what must hold is that no document sees another; the positions a
packed document is given may depend on the window in training (random positions), so the equality
with the document alone is evaluation's property."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posenc.check.hooks import hooks_reading, which
from posenc.check.length import length_cause, prefix_gaps
from posenc.check.results import EXACT, CheckResult, Measured, Status, holds, in_modes, max_abs, not_offered
from posenc.check.subject import MODE_NAMES, MODES, VOCAB, Subject, forward, seeded
from posenc.errors import UserError
from posenc.nn.encodings.base import PositionOutOfRange

#: a change that must reach a logit moves it by more than this
REACHES = 1e-8
#: |loss at init - ln V| allowed: logits of std s add about s²/2 nats, so s up to about 1
INIT_LOSS_TOLERANCE = 0.5


def causality(s: Subject) -> list[CheckResult]:
    """The logits at t do not change when tokens t+1.. change (and the later ones do), in each mode."""
    x, t = s.tokens(), s.T // 2
    changed = x.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % VOCAB
    found = {}
    for mode in MODES:
        model = s.model(mode=mode)
        a, b = forward(model, x), forward(model, changed)
        past, future = max_abs(a[:, : t + 1], b[:, : t + 1]), max_abs(a[:, t + 1:], b[:, t + 1:])
        note = (f"a token sees the tokens after it: the logits at positions 0..{t} move by {past:.1e} when tokens "
                f"{t + 1}.. change; {future_cause(s, mode)}" if past > EXACT else
                "changing the tokens after t changes nothing at all")
        found[mode] = Measured(past <= EXACT and future > REACHES, f"max |Δ| {past:.1e}", note)
    return [in_modes("causal: the future reaches no past logit", found, MODE_NAMES)]


def future_cause(s: Subject, mode: str) -> str:
    """Which hook lets later tokens reach earlier positions, as measured on each hook alone."""
    readers = hooks_reading(s, "future", mode)
    if readers:
        return (f"{which(readers)} later tokens (its output for positions 0..{s.T // 2 - 1} changes when the inputs "
                f"after them change)")
    return ("no hook's output for earlier positions changes when later inputs do, so the leak is outside the hooks "
            "measured alone (a fused kernel, or a module around the encoding)")


def loss_at_init(s: Subject) -> list[CheckResult]:
    """Random tokens at init cost about ln V nats: the encoding does not blow up the logits."""
    x, y = s.tokens(1, batch=4), s.tokens(2, batch=4)
    found = {}
    for mode in MODES:
        with torch.no_grad():
            loss = float(s.model(visible=False, mode=mode)(x, y)[1])
        found[mode] = Measured(abs(loss - math.log(VOCAB)) <= INIT_LOSS_TOLERANCE, f"{loss:.3f}",
                               f"the loss at init is {loss:.3f}, far from ln V = {math.log(VOCAB):.3f}: the logits "
                               f"are far from uniform")
    name = f"loss at init ≈ ln V ± {INIT_LOSS_TOLERANCE}"
    row = in_modes(name, found, MODE_NAMES)
    return [CheckResult(name, row.status, f"{row.measured} vs {math.log(VOCAB):.3f}", row.note)]


def default_positions(s: Subject) -> list[CheckResult]:
    """model(x) equals model(x, pos=arange(T)): the default is positions 0..T-1, in each mode."""
    x, found = s.tokens(), {}
    for mode in MODES:
        model = s.model(mode=mode)
        diff = max_abs(forward(model, x), forward(model, x, pos=torch.arange(s.T)))
        found[mode] = Measured(diff <= EXACT, f"max |Δ| {diff:.1e}",
                               f"model(x) differs from model(x, pos=arange(T)) by {diff:.1e}")
    return [in_modes("default positions = 0..T−1", found, MODE_NAMES)]


BATCH_NAME = "batch: sequences are independent"


def batch_independence(s: Subject) -> list[CheckResult]:
    """The first sequence's logits, and the gradients of its loss with respect to every parameter, do
    not change when the other sequences of its batch change, in each mode: a batch is several
    independent sequences, so a run's numbers do not depend on how its windows were batched."""
    x, y = s.tokens(7, batch=3), s.tokens(8, batch=3)
    changed = x.clone()
    changed[1:] = (changed[1:] + 1) % VOCAB
    found = {}
    for mode in MODES:
        model = s.model(mode=mode)
        (logits, grads), (logits2, grads2) = (first_sequence(model, tokens, y[0]) for tokens in (x, changed))
        moved = max_abs(logits, logits2)
        gaps = {name: max_abs(a, b) for name, a, b in zip(grads, grads.values(), grads2.values())}
        worst = max(gaps, key=gaps.__getitem__)
        ok = moved <= EXACT and gaps[worst] <= EXACT
        found[mode] = Measured(ok, f"logits {moved:.1e}, gradients {gaps[worst]:.1e}", "" if ok else
                               f"changing the other sequences of the batch moves the first one's logits by {moved:.1e} "
                               f"and the gradients of its loss by up to {gaps[worst]:.1e} ({worst}): "
                               f"{batch_cause(s, mode)}")
    return [in_modes(BATCH_NAME, found, MODE_NAMES)]


def first_sequence(model, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The first sequence's logits in the batch x and the gradient of its loss (targets y) with respect
    to each parameter (zeros where none reaches it), the forward's randomness drawn from one seed."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    with seeded():
        logits = model(x)[0][0]  # (T, V)
    grads = torch.autograd.grad(F.cross_entropy(logits, y), list(params.values()), allow_unused=True)
    return logits.detach(), {n: g if g is not None else torch.zeros_like(p)
                             for (n, p), g in zip(params.items(), grads)}


def batch_cause(s: Subject, mode: str) -> str:
    """Which hook reads the other sequences of its batch, as measured on each hook alone."""
    readers = hooks_reading(s, "batch", mode)
    if readers:
        return f"{which(readers)} the other sequences (its output for the first one changes when only they change)"
    return ("no hook's output for the first sequence changes when only the others do, so the mixing is outside the "
            "hooks measured alone (a fused kernel, or a module around the encoding)")


def spans(doc: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document after the first of each row of doc (B, T)."""
    out = []
    for row, ids in enumerate(doc.tolist()):
        starts = [i for i in range(1, len(ids)) if ids[i] != ids[i - 1]]
        out += [(row, a, b) for a, b in zip(starts, [*starts[1:], len(ids)])]
    return out


def documents(s: Subject) -> list[CheckResult]:
    """dataset.packing=documents: a document packed after others gives the same logits as alone
    (evaluation), and no document sees another (both modes). A chunked layer (Llama 4) cuts its
    chunks at window indices, which a packed document does not share with the document alone: it is
    checked as a sliding window of the same size here."""
    name = "documents: B after A = B alone"
    if not s.softmax:
        return [not_offered(name, "linear attention has no mask to keep documents apart")]
    sliding = {f"layout.kinds.{k}.chunked": False for k, kind in s.cfg.layout.kinds.items() if kind.chunked}
    cfg, x, doc = s.with_changes(**sliding) if sliding else None, s.tokens(), s.documents()
    found = {}
    for mode in MODES:
        model = s.model(cfg=cfg, mode=mode)
        packed = forward(model, x, doc=doc)
        leak = document_leak(model, x, doc, packed)
        if leak > EXACT:
            found[mode] = Measured(False, f"across documents {leak:.1e}", f"a document sees another: changing each "
                                   f"row's first document moves the later ones' logits by {leak:.1e}")
        elif mode == "train":
            found[mode] = Measured(True, f"across documents {leak:.1e}")
        else:
            worst = max(max_abs(packed[row:row + 1, a:b], forward(model, x[row:row + 1, a:b]))
                        for row, a, b in spans(doc))
            found[mode] = Measured(worst <= EXACT, f"max |Δ| {worst:.1e}",
                                   "" if worst <= EXACT else documents_cause(s, worst))
    return [in_modes(name, found, MODE_NAMES)]


def document_leak(model, x: torch.Tensor, doc: torch.Tensor, packed: torch.Tensor) -> float:
    """max |Δ| of the later documents' logits when every row's first document changes."""
    changed = x.clone()
    first = doc == doc[:, :1]
    changed[first] = (changed[first] + 1) % VOCAB
    later = ~first
    return max_abs(packed[later], forward(model, changed, doc=doc)[later])


def documents_cause(s: Subject, worst: float) -> str:
    """Why a packed document's logits differ from the document's alone when none sees another, from
    what is measured: the window's length reaching the logits (the prefix row: a packed document sits
    in a longer window than alone), else positions that do not restart at 0."""
    where = f"a packed document's logits differ from the document's alone by {worst:.1e}, though no document sees another"
    if max(prefix_gaps(s).values()) > EXACT:
        return f"{where}; the logits depend on the rest of the window, and a packed document sits in a longer one: " \
               f"{length_cause(s)} (see the prefix row)"
    return (f"{where}, and the window's length reaches no logit, so a document's positions differ from its own: they "
            f"must restart at 0 in every document (use ctx.pos, not window indices)")


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
    cfg = s.with_changes(**kinds, **chunks)
    L, reach = int(s.cfg.model.n_layer), s.model(cfg=cfg).encoding.reach
    span = L * (window - 1 + reach)
    name = f"windows: nothing beyond L·(w−1{f'+{reach}' if reach else ''}) = {span}"
    x, i = s.tokens(), s.T - 1
    edge = i - span
    found = {}
    for mode in MODES:
        model = s.model(cfg=cfg, mode=mode)
        diffs = []
        for where in (edge - 1, edge):
            changed = x.clone()
            changed[:, where] = (changed[:, where] + 1) % VOCAB
            diffs.append(max_abs(forward(model, x)[:, i], forward(model, changed)[:, i]))
        beyond, inside = diffs
        found[mode] = Measured(beyond <= EXACT and inside > REACHES, f"beyond {beyond:.1e}, edge {inside:.1e}",
                               f"a token beyond the windows reaches the logit: changing token {edge - 1} moves the "
                               f"logit at {i} by {beyond:.1e}" if beyond > EXACT else
                               f"the oldest token the windows reach ({edge}) changes nothing at {i}")
    return [in_modes(name, found, MODE_NAMES)]


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
