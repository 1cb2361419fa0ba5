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

from posenc.check.results import CheckResult, holds
from posenc.check.subject import Subject

#: a parameter whose RMS gradient is below this fraction of the model's median cannot learn
NEGLIGIBLE = 1e-6


def relative_gradients(s: Subject) -> dict[str, float]:
    """{parameter name: RMS gradient / the median RMS gradient} at initialisation."""
    model = s.model(visible=False).train()
    _, loss = model(s.tokens(5, batch=4), s.tokens(6, batch=4))
    loss.backward()
    rms = {n: float(p.grad.norm()) / math.sqrt(p.numel()) if p.grad is not None else 0.0
           for n, p in model.named_parameters() if p.requires_grad}
    median = sorted(rms.values())[len(rms) // 2]
    return {n: v / median for n, v in rms.items()}


def every_parameter_learns(s: Subject) -> list[CheckResult]:
    ratios = relative_gradients(s)
    stuck = sorted((n for n, r in ratios.items() if r < NEGLIGIBLE), key=ratios.get)
    name, smallest = min(ratios.items(), key=lambda kv: kv[1])
    return [holds("every parameter can learn", not stuck, f"smallest {smallest:.0e}× median ({name})",
                  f"{', '.join(stuck)} cannot learn: its gradient is {ratios[stuck[0]]:.0e} of the median "
                  f"(softmax cancels a constant added to every logit of a row)" if stuck else "")]
