"""Whether the window's length reaches the logits, and which hook lets it.

A causal language model promises more than "the future reaches no past logit": the logits of the
first t tokens of a window are those of the same t tokens run alone, whatever the window's length
T. Evaluation at 16× the training length, documents packed into a window, the chunked path of long
evaluation (a slice of queries and the keys they see) and generation with a growing window all rely
on it. The causality row cannot see a hook that reads T (``ctx.T``, ``q_pos.shape[-1]``, the length
``prepare`` is given): it changes tokens, never the window's length. A bias −(i − j)(T − i)/T keeps
causality and breaks this.

Where the row fails, a second measurement names the hook (posenc/check/hooks.py): each hook the
layers use is asked for the first t positions in a window of T and in one of t (``length``), and in
a window of T whose later inputs changed (``future``). A hook that moves in the second reads later
tokens (the causality row fails too), not the length; one that moves in the first alone reads the
length. The row runs in evaluation only: in training the window has one length, and an encoding
may legitimately draw positions that depend on it (random positions, Ruoss et al., 2023).
"""

from __future__ import annotations

from posenc.check.hooks import hooks_reading, which
from posenc.check.results import EXACT, CheckResult, holds, max_abs
from posenc.check.subject import Subject, forward

NAME = "prefix: first t tokens = them alone"


def prefixes(T: int) -> list[int]:
    """The prefix lengths t compared: 1 (a token alone), a short prefix, half the window, all but
    the last token."""
    return sorted({t for t in (1, 5, T // 2, T - 1) if 0 < t < T})


def prefix_gaps(s: Subject) -> dict[int, float]:
    """t -> max |Δ| between the window's logits at 0..t-1 and those of tokens 0..t-1 run alone."""
    model, x = s.model(), s.tokens()
    full = forward(model, x)
    return {t: max_abs(full[:, :t], forward(model, x[:, :t])) for t in prefixes(s.T)}


def prefix_consistency(s: Subject) -> list[CheckResult]:
    """The logits of the first t tokens of a window equal those of the t tokens alone, for several t."""
    gaps = prefix_gaps(s)
    worst = max(gaps.values())
    measured = f"max |Δ| {worst:.1e} (t = {', '.join(map(str, gaps))} of {s.T})"
    return [holds(NAME, worst <= EXACT, measured, "" if worst <= EXACT else length_note(s, gaps))]


def length_note(s: Subject, gaps: dict[int, float]) -> str:
    """What differed (which prefixes, by how much), and which hook, from the second measurement."""
    wrong = [t for t, gap in gaps.items() if gap > EXACT]
    where = (f"the logits of the first {', '.join(map(str, wrong))} tokens differ from those tokens run alone "
             f"(by up to {max(gaps.values()):.1e})")
    return f"{where}: {length_cause(s)}"


def length_cause(s: Subject) -> str:
    """Which hook makes the first tokens' logits depend on the rest of the window, as measured: later
    tokens (``future``), else the window's length alone (``length``), else no hook's output."""
    t = s.T // 2
    future, length = hooks_reading(s, "future"), hooks_reading(s, "length")
    if future:
        return (f"{which(future)} later tokens — its output for positions 0..{t - 1} changes when the inputs after "
                f"them change, the window's length kept (see the causal row)")
    if length:
        return (f"{which(length)} the window's length — its output for the first {t} positions differs between a "
                f"window of {s.T} and one of {t}, and not when only the inputs after them change; compute from the "
                f"positions given (ctx.pos, q_pos, k_pos), never from T, ctx.T or how many positions there are")
    return ("no hook's output for those positions changes with the window's length or with later inputs: state kept "
            "between forwards (a cache sized by prepare(length)?) or a module outside the encoding reads the whole "
            "window")
