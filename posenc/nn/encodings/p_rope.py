"""p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional
Encodings useful?", §6): RoPE with its lowest frequencies removed.

RoPE rotates pair i of a query or key at position m by m·θ_i, θ_i = base^(-2i/d), i = 0 .. d/2-1,
d = head_dim. The paper finds that the lowest frequencies (largest i) carry little position and
act as "semantic channels" whose rotation becomes unstable over long contexts; p-RoPE keeps the
highest fraction p of the frequencies and sets the others to zero:

    θ^p_i = θ_i = base^(-2i/d)   for i <  floor(p·d/2)   (rotated, with the FULL spectrum's θ_i)
    θ^p_i = 0                    for i >= floor(p·d/2)   (cos 1, sin 0: the pair passes through)

p = 1 is RoPE and p = 0 is NoPE. The count floor(p·d/2) and the zero-padded frequencies follow
the authors' Gemma code (``rope_proportion``: ``int(p * head_dim // 2)`` rotated pairs, the
rest padded with frequency 0). Trained from scratch (Gemma 2B, Table 2), truncating the lowest
frequencies keeps, and slightly improves, the validation perplexity. The default p = 0.75 is a
mild truncation (a quarter of the frequencies, the slowest, dropped).

Not the same as ``encoding=rope encoding.fraction=p`` (GPT-NeoX/GPT-J partial rotary): that
rotates the first fraction·d dims with frequencies re-spread over the rotated width,
θ_i = base^(-2i/(fraction·d)), so it keeps the lowest frequency base^(-1+2/(fraction·d)) and
drops the dims in between. p-RoPE keeps θ_0 .. θ_{k-1} of the full spectrum exactly as RoPE
has them and drops θ_k .. θ_{d/2-1}, the slowest ones.

Which dims pass through follows ``style``: interleaved pairs (x[2i], x[2i+1]), so the last
d - 2·floor(p·d/2) dims; half (GPT-NeoX/LLaMA/Gemma) pairs (x[i], x[i + d/2]), so dims
floor(p·d/2) .. d/2-1 and their partners in the second half. Eval-time ``scaling`` applies to
the rotated frequencies as in RoPE (a zero frequency stays zero).
"""

from __future__ import annotations

from torch import Tensor

from posenc.nn.encodings.rope import RoPE


def rotated_pairs(p: float, head_dim: int) -> int:
    """floor(p·head_dim/2): how many of the head_dim/2 frequencies p-RoPE keeps (the highest)."""
    return int(p * head_dim // 2)


class PRoPE(RoPE):
    """RoPE over the full head_dim spectrum with the lowest (1 - p) of its frequencies set to 0."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        name: str = "p_rope",
        p: float = 0.75,
        base: float = 10000.0,
        style: str = "interleaved",
        scaling: str = "none",
        scaling_factor: float = 1.0,
        original_max_len: int | None = None,
        train_len: int | None = None,
    ) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"encoding.p must be in [0, 1] (the fraction of RoPE's frequencies kept), got {p}")
        # fraction=1: the frequencies are those of the whole head_dim, as in RoPE
        super().__init__(d_model, n_head, name, base=base, fraction=1.0, style=style, scaling=scaling,
                         scaling_factor=scaling_factor, original_max_len=original_max_len, train_len=train_len)
        self.p = float(p)
        self.n_rotated = rotated_pairs(self.p, self.head_dim)
        # θ_i = 0 for the lowest frequencies: cos 1, sin 0, the pair is not rotated. The cos/sin
        # caches are built from inv_freq in prepare(), after this.
        self.inv_freq[self.n_rotated:] = 0.0

    def frequencies(self, length: int) -> Tensor:
        """RoPE's (scaled) frequencies with the lowest set to 0, also when a length-dependent
        scaling (dynamic, longrope) recomputes them for a new length."""
        inv_freq = super().frequencies(length)
        inv_freq[getattr(self, "n_rotated", inv_freq.shape[0]):] = 0.0
        return inv_freq

    def options(self) -> dict[str, object]:
        opts: dict[str, object] = {"p": self.p, "base": self.base, "style": self.style}
        if self.scaling != "none":
            opts.update(scaling=self.scaling, scaling_factor=self.scaling_factor)
        return opts
