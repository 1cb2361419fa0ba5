"""Attention sinks: a learned per-head logit that joins the softmax's denominator (OpenAI, 2025,
GPT-OSS model card and reference implementation; Xiao et al., ICLR 2024, "Efficient Streaming
Language Models with Attention Sinks", whose sinks are the first tokens themselves).

Each head h of each layer has a sink logit s_h, a key with a zero value that every query sees:

    a_ij = exp(z_ij) / (Σ_k exp(z_ik) + exp(s_h)),   o_i = Σ_j a_ij v_j

so a head can put weight on nothing (Σ_j a_ij < 1) instead of dumping it on the first token,
the pattern StreamingLLM found and had to keep in its window. Whether a learned sink changes
length extrapolation, and sliding-window layers (GPT-OSS pairs sinks with banded layers), is the
question posenc lets one measure (``layout=gpt_oss``, ``layout=sliding``).

This is the contract's ``sink_logit`` hook: on CPU one more key column with logit s_h and a zero
value in the explicit mask; on CUDA FlexAttention's log-sum-exp rescales the output by
σ(lse - s_h). Any encoding may be wrapped (``encoding@encoding.inner=rope``, the default, as in
GPT-OSS).

**Parameters and their scale.** s (n_layer x H) enters as ``scale · s``, s starting at 0 (a sink
worth one key of logit 0). One Adam step moves s by about lr, so the logit moves by scale·lr;
scale = √head_dim by default (as T5's table here), which lets 400 steps at lr 2e-3 move a sink
logit by up to ~4.5, the range of the logits it competes with, where unscaled it could move 0.8.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.encodings.mechanism import Mechanism, combine_sinks


class Sink(Mechanism):
    """A learned sink logit per head and layer in the softmax's denominator."""

    def __init__(
        self,
        inner: PositionalEncoding,
        n_layer: int,
        name: str = "sink",
        scale: float | None = None,
    ) -> None:
        super().__init__(inner, name, n_layer)
        if inner.offers("normalise"):
            raise ValueError(f"a sink joins softmax's denominator, which encoding.inner '{inner.name}' replaces — "
                             f"wrap a softmax encoding (e.g. encoding@encoding.inner=rope)")
        self.scale = self.parameter_scale("scale", scale)
        self.sink = nn.Parameter(torch.zeros(n_layer, self.n_head))

    def sink_logit(self, layer: int = 0) -> Tensor:
        """(H,): scale·s_h of this layer (joined with the inner encoding's sink, if it has one)."""
        return combine_sinks(self.inner_sink_logit(layer), self.scale * self.sink[layer])

    def options(self) -> dict[str, object]:
        return {**super().options(), "scale": self.scale}
