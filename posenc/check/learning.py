"""Every parameter can learn: at initialisation each one receives a gradient that is not negligible.

A gradient can vanish by construction: softmax is unchanged when one constant is added to every
logit of a row, so a per-head offset added to all of a query's logits (the last bias of an MLP
whose output is a logit bias, a learned per-head constant) gets a gradient of exactly zero, up to
rounding (~1e-16 of the others in float64): it never moves, whatever the learning rate. Measured
as each parameter's RMS gradient, ‖∂L/∂p‖ / √numel, relative to the median over the model's
parameters, on one batch of random tokens in float64.
"""

from __future__ import annotations

import math

import torch

from posenc.check.hooks import hook_outputs
from posenc.check.results import EXACT, CheckResult, holds, max_abs
from posenc.check.subject import Subject, forward

#: a parameter whose RMS gradient is below this fraction of the model's median cannot learn
NEGLIGIBLE = 1e-6
#: how far a stuck parameter is moved to see what it changes (the second measurement)
NUDGE = 0.5


def relative_gradients(s: Subject) -> dict[str, float | None]:
    """{parameter name: RMS gradient / the median RMS gradient} at initialisation, in training mode
    (None: no gradient reached it at all)."""
    model = s.model(visible=False, mode="train")
    _, loss = model(s.tokens(5, batch=4), s.tokens(6, batch=4))
    loss.backward()
    rms = {n: float(p.grad.norm()) / math.sqrt(p.numel()) if p.grad is not None else None
           for n, p in model.named_parameters() if p.requires_grad}
    median = sorted(v for v in rms.values() if v is not None)[len([v for v in rms.values() if v is not None]) // 2]
    return {n: None if v is None else v / median for n, v in rms.items()}


def every_parameter_learns(s: Subject) -> list[CheckResult]:
    ratios = relative_gradients(s)
    stuck = sorted((n for n, r in ratios.items() if r is None or r < NEGLIGIBLE), key=lambda n: ratios[n] or 0.0)
    name, smallest = min(ratios.items(), key=lambda kv: kv[1] or 0.0)
    measured = f"smallest {smallest or 0:.0e}× median ({name})"
    if not stuck:
        return [holds("every parameter can learn", True, measured)]
    return [holds("every parameter can learn", False, measured,
                  "; ".join(f"{n} cannot learn: {stuck_cause(s, n, ratios[n])}" for n in stuck[:3]))]


def stuck_cause(s: Subject, name: str, ratio: float | None) -> str:
    """What was measured of a parameter that gets no gradient: how small it is, and what moving it
    by NUDGE changes (the logits; each hook's output): a cause only where that shows one."""
    got = "no gradient reaches it" if ratio is None else f"its gradient is {ratio:.0e} of the median"
    model = s.model(visible=False, mode="train")
    param = dict(model.named_parameters())[name]
    x = s.tokens(5, batch=4)
    before, hooks_before = forward(model, x), layer_hooks(model)
    with torch.no_grad():
        param.add_(NUDGE * torch.randn(param.shape, generator=torch.Generator().manual_seed(7), dtype=param.dtype))
    moved, hooks_after = max_abs(before, forward(model, x)), layer_hooks(model)
    changed = {hook: row_spread(hooks_before[hook], out) for hook, out in hooks_after.items()
               if hook in hooks_before and max_abs(hooks_before[hook][0], out[0]) > EXACT}
    if not changed:
        return (f"{got}; moving it by {NUDGE} changes no hook's output and the logits by {moved:.1e}: "
                f"the forward measured here (CPU, float64, training) does not read it")
    constant = [hook for hook, spread in changed.items() if spread is not None and spread <= EXACT]
    if constant and moved <= EXACT * 1e3 and len(constant) == len(changed):
        return (f"{got}; moving it by {NUDGE} moves {', '.join(constant)} by the same amount at every key of a query "
                f"(spread along the keys ≤ {max(changed[h] for h in constant):.0e}) and the logits by {moved:.1e}: "
                f"softmax cancels a constant added to every logit of a row")
    return f"{got}; moving it by {NUDGE} changes {', '.join(changed)} and the logits by {moved:.1e}"


def layer_hooks(model) -> dict[str, tuple[torch.Tensor, bool]]:
    """Every hook output of every layer's encoding of model on fixed inputs: '<hook> (layer l)' ->
    (output, pairwise)."""
    out = {}
    for layer in range(model.n_layer):
        encoding = model.encoding.for_layer(layer)
        T, g = 12, torch.Generator().manual_seed(9)
        q, k = (torch.randn(2, encoding.n_head, T, encoding.head_dim, generator=g, dtype=torch.float64) for _ in "qk")
        x = torch.randn(2, T, encoding.d_model, generator=g, dtype=torch.float64)
        scores = torch.randn(2, encoding.n_head, T, T, generator=g, dtype=torch.float64)
        for hook, value in hook_outputs(encoding, q, k, x, scores, layer).items():
            out.setdefault(hook if model.n_layer == 1 or encoding is model.encoding else f"{hook} (layer {layer})",
                           value)
    return out


def row_spread(before: tuple[torch.Tensor, bool], after: tuple[torch.Tensor, bool]) -> float | None:
    """For a query-by-key term: the largest spread (max − min) of its change along the visible keys
    of one query (0: a constant per row, which softmax cancels); None for a per-position one."""
    (a, pairwise), (b, _) = before, after
    if not pairwise:
        return None
    T = a.shape[-1]
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    d = (b - a).double()
    high = d.masked_fill(~seen, float("-inf")).amax(-1)
    low = d.masked_fill(~seen, float("inf")).amin(-1)
    return float((high - low).max())
