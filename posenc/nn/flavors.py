"""Model flavours: the block recipe as data, separate from the model's size (torchtitan's flavors).

A flavour says how a block is built and initialised: which norm, which MLP, whether linears
carry biases, whether the output head shares the token embedding, and the init scales. The
size (n_layer, n_head, d_model) lives in conf/model/*.yaml; ``model.flavor`` picks the recipe.
Measurements behind the choices: docs/model_recipe.md.
"""

from __future__ import annotations

from dataclasses import dataclass

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")


@dataclass(frozen=True)
class Flavor:
    name: str
    norm: str             # layernorm (Ba et al., 2016) | rmsnorm (Zhang & Sennrich, 2019)
    mlp: str              # gelu: W2·GELU(W1·x) | swiglu: W2·(SiLU(W1·x) ⊙ W3·x) (Shazeer, 2020)
    bias: bool            # biases in every linear and LayerNorm
    tie_embeddings: bool  # output head = token embedding (Press & Wolf, 2017)
    init_std: float       # N(0, σ) for matmul weights; residual projections get σ/√(2L) (GPT-2)
    embed_std: float      # N(0, σ) for the token embedding
    head_std: float       # N(0, σ) for an untied output head (unused when tied)

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"flavor norm must be one of {', '.join(NORMS)}, got '{self.norm}'")
        if self.mlp not in MLPS:
            raise ValueError(f"flavor mlp must be one of {', '.join(MLPS)}, got '{self.mlp}'")


FLAVORS: dict[str, Flavor] = {
    # nanoGPT / GPT-2: pre-LayerNorm, GELU MLP, biases everywhere, tied embeddings, std 0.02
    "gpt2": Flavor("gpt2", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True,
                   init_std=0.02, embed_std=0.02, head_std=0.02),
    # Llama: pre-RMSNorm, SwiGLU MLP with GPT-2's MLP parameter count, no biases, untied head
    "llama": Flavor("llama", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False,
                    init_std=0.02, embed_std=1.0, head_std=0.02),
}


def get_flavor(flavor: str | Flavor) -> Flavor:
    """A flavour by name (model.flavor=llama), or a Flavor passed through (for ablations)."""
    if isinstance(flavor, Flavor):
        return flavor
    if flavor not in FLAVORS:
        raise ValueError(f"model.flavor must be one of {', '.join(FLAVORS)}, got '{flavor}'")
    return FLAVORS[flavor]


def swiglu_hidden(d_model: int) -> int:
    """SwiGLU hidden size whose three d×h matrices hold as many weights as GELU's two d×4d:
    3·d·h = 8·d², h = 8d/3, rounded to a multiple of 8 (within 1% of the GELU MLP for d ≥ 64)."""
    return max(8, 8 * round(8 * d_model / 3 / 8))
