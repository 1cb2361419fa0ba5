"""Layer layouts: which layers attend locally (a window) and which globally, and the encoding of
each kind of layer.

Current models choose the encoding per layer together with the layer's window, and credit that
pairing for their long-context behaviour: Mistral's sliding window on every layer; Gemma 2 / 3's
local:global layers (1:1, then 5:1 with RoPE base 10k on local and 1M on global layers); Llama 4's
chunked local RoPE layers with global NoPE layers (3:1); Cohere's sliding-window RoPE layers with a
global NoPE layer (3:1); GPT-OSS's alternating banded and dense layers. A layout is data
(conf/layout/*.yaml): a ``pattern`` of kind names repeated over the layers, and per kind a
window, an optional encoding and a token mixer: softmax attention, or a gated linear recurrence
(posenc/nn/recurrent.py: the gated delta rule of Qwen3-Next and Kimi Linear, Mamba-2's scalar-decay
gated linear attention), whose layers have no window and take position from the recurrence and
from their encoding's ``transform_qk`` alone.

The pattern is anchored at the last layer: layer l takes pattern[(l - n_layer) mod len(pattern)],
so the last layer always takes the pattern's last kind (the global layer of every preset), and
a model with fewer layers than the pattern still has one (4 layers of Gemma 3's 5:1 are 3:1).
"""

from __future__ import annotations

from torch import nn

from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.mask import GLOBAL, Window
from posenc.nn.recurrent import RULES

#: the token mixers a layer kind may have: softmax attention, or one of the recurrences
MIXERS = ("softmax", *RULES)


def layer_kinds(pattern: list[str], n_layer: int) -> list[str]:
    """The kind of each layer: the pattern repeated and anchored at the last layer."""
    if not pattern:
        raise ValueError("layout.pattern needs at least one layer kind")
    return [pattern[(layer - n_layer) % len(pattern)] for layer in range(n_layer)]


class LayerLayout:
    """Each layer's kind, window and mixer. A plain class (not a dataclass) so that Hydra passes it
    to the model as an object instead of converting it into a config."""

    def __init__(self, kinds: list[str], windows: dict[str, Window], name: str = "uniform",
                 mixers: dict[str, str] | None = None) -> None:
        missing = sorted(set(kinds) - set(windows))
        if missing:
            raise ValueError(f"layout.pattern names {', '.join(missing)}, which layout.kinds does not define")
        self.name = name
        self.kinds = list(kinds)
        self.windows = dict(windows)
        self.mixers = {kind: (mixers or {}).get(kind, "softmax") for kind in self.windows}
        for kind, mixer in self.mixers.items():
            if mixer not in MIXERS:
                raise ValueError(f"layout.kinds.{kind}.mixer must be one of {', '.join(MIXERS)}, got '{mixer}'")
            if mixer != "softmax" and self.windows[kind].size is not None:
                # a recurrence carries its whole past in its state: there is no window to limit
                raise ValueError(f"layout.kinds.{kind} is a {mixer} layer, which has no attention window — set "
                                 f"layout.kinds.{kind}.window=null (windows apply to softmax layers only)")

    @classmethod
    def uniform(cls, n_layer: int, window: Window = GLOBAL) -> LayerLayout:
        return cls(["global"] * n_layer, {"global": window})

    def window(self, layer: int) -> Window:
        return self.windows[self.kinds[layer]]

    def mixer(self, layer: int) -> str:
        """'softmax', or the recurrence layer ``layer`` mixes its tokens with."""
        return self.mixers[self.kinds[layer]]

    @property
    def recurrent(self) -> bool:
        """Whether any layer is a recurrent layer."""
        return any(self.mixer(layer) != "softmax" for layer in range(len(self.kinds)))

    @property
    def limited(self) -> bool:
        """Whether any layer has a window."""
        return any(w.size is not None for w in self.windows.values())

    def describe(self) -> str:
        """'local (sliding 64) ×3, global ×1' or 'recurrent (gated_delta) ×3, attention (global) ×1':
        the layout in words, for logs and summaries."""
        counts = {k: self.kinds.count(k) for k in dict.fromkeys(self.kinds)}
        what = {k: self.windows[k].describe() if self.mixers[k] == "softmax" else self.mixers[k] for k in counts}
        return ", ".join(f"{k} ({what[k]}) ×{n}" for k, n in counts.items())


class LayeredEncoding(PositionalEncoding):
    """One encoding per layer kind (Gemma 3: RoPE base 10k on local layers, 1M on global ones;
    Llama 4 and Cohere: RoPE on local layers, NoPE on global ones). Each block asks
    ``for_layer``; the hooks of this module itself are the base class's no-ops."""

    def __init__(self, encodings: dict[str, PositionalEncoding], kinds: list[str], name: str) -> None:
        first = next(iter(encodings.values()))
        super().__init__(first.d_model, first.n_head, name)
        additive = sorted({e.name for e in encodings.values() if e.offers("embed")})
        if additive:
            raise ValueError(f"{', '.join(additive)} adds positions to the token embeddings once, before the first "
                             f"layer, so it cannot differ per layer kind — give layout.kinds.*.encoding a rotary, "
                             f"bias or no encoding, or leave it empty")
        # modules that are one encoding in several kinds are registered once, so they share weights
        self.encodings = nn.ModuleDict(encodings)
        self.kinds = list(kinds)
        lengths = [e.max_len for e in encodings.values() if e.max_len is not None]
        self.max_len = min(lengths) if lengths else None

    def for_layer(self, layer: int) -> PositionalEncoding:
        return self.encodings[self.kinds[layer]]

    def prepare(self, length: int) -> None:
        for encoding in self.encodings.values():
            encoding.prepare(length)

    def check_length(self, length: int) -> None:
        for encoding in self.encodings.values():
            encoding.check_length(length)

    def cache_epoch(self, length: int) -> object:
        return tuple(e.cache_epoch(length) for e in self.encodings.values())

    def stale_cache(self) -> str | None:
        stale = dict.fromkeys(f"{kind}: {why}" for kind, e in self.encodings.items() if (why := e.stale_cache()))
        return "; ".join(stale) or None

    def options(self) -> dict[str, object]:
        return {kind: {"name": e.name, **e.options()} for kind, e in self.encodings.items()}
