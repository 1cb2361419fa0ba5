"""Model flavours: the block recipe as data, separate from the model's size (torchtitan's flavors).

A flavour says how a block is built and initialised: which norm, which MLP, whether linears
carry biases, whether the output head shares the token embedding, and the init scales. The
size (n_layer, n_head, d_model) lives in conf/model/*.yaml; ``model.flavor`` picks the recipe.
Measurements behind the choices: docs/model_recipe.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
INITS = ("gpt2", "fan_in")


@dataclass(frozen=True)
class Flavor:
    name: str
    norm: str             # layernorm (Ba et al., 2016) | rmsnorm (Zhang & Sennrich, 2019)
    mlp: str              # gelu: W2·GELU(W1·x) | swiglu: W2·(SiLU(W1·x) ⊙ W3·x) (Shazeer, 2020)
    bias: bool            # biases in every linear and LayerNorm
    tie_embeddings: bool  # output head = token embedding (Press & Wolf, 2017)
    init: str             # gpt2: σ = 0.02 | fan_in: σ = 1/√(3d), embedding √(2/d) (see init_stds)
    init_std: float | None = None   # overrides of the scheme's σ, for ablations
    embed_std: float | None = None
    head_std: float | None = None

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"flavor norm must be one of {', '.join(NORMS)}, got '{self.norm}'")
        if self.mlp not in MLPS:
            raise ValueError(f"flavor mlp must be one of {', '.join(MLPS)}, got '{self.mlp}'")
        if self.init not in INITS:
            raise ValueError(f"flavor init must be one of {', '.join(INITS)}, got '{self.init}'")


FLAVORS: dict[str, Flavor] = {
    # nanoGPT / GPT-2: pre-LayerNorm, GELU MLP, biases everywhere, tied embeddings, std 0.02
    "gpt2": Flavor("gpt2", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True,
                   init="gpt2"),
    # Llama: pre-RMSNorm, SwiGLU MLP with GPT-2's MLP parameter count, no biases, untied head;
    # fan-in init (PyTorch's nn.Linear scale, x-transformers' embedding): docs/model_recipe.md
    "llama": Flavor("llama", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False,
                    init="fan_in"),
}


#: the components a recipe ablation switches one at a time (model.<switch>=..., null: the flavour's)
SWITCHES = ("norm", "mlp", "bias", "tie_embeddings", "init")


def get_flavor(flavor: str | Flavor, **switches: str | bool | None) -> Flavor:
    """A flavour by name (model.flavor=llama), or a Flavor passed through (for ablations), with
    each switch that is not None replacing that component (model.mlp=gelu: llama with GELU's MLP
    and everything else llama's). The result is named after what changed: 'llama+mlp=gelu'."""
    if not isinstance(flavor, Flavor):
        if flavor not in FLAVORS:
            raise ValueError(f"model.flavor must be one of {', '.join(FLAVORS)}, got '{flavor}'")
        flavor = FLAVORS[flavor]
    unknown = set(switches) - set(SWITCHES)
    if unknown:
        raise ValueError(f"unknown flavour switch {sorted(unknown)[0]!r}: the switches are {', '.join(SWITCHES)}")
    changed = {key: value for key, value in switches.items()
               if value is not None and value != getattr(flavor, key)}
    if not changed:
        return flavor
    name = flavor.name + "".join(f"+{key}={str(value).lower()}" for key, value in changed.items())
    return replace(flavor, name=name, **changed)  # __post_init__ checks the new values


def init_stds(flavor: Flavor, d_model: int) -> tuple[float, float, float]:
    """(σ of matmul weights, σ of the token embedding, σ of an untied head).

    gpt2: 0.02 for all (GPT-2). fan_in: 1/√(3d), the std of PyTorch's default nn.Linear
    init U(±1/√d), for weights and head; √(2/d) (Kaiming normal, as x-transformers) for the
    embedding. At d=128 fan_in trains ALiBi to ppl 4.6 where 0.02 gives 5.2 (model_recipe.md).
    """
    if flavor.init == "gpt2":
        std, embed, head = 0.02, 0.02, 0.02
    else:
        std, embed, head = (3 * d_model) ** -0.5, (2 / d_model) ** 0.5, (3 * d_model) ** -0.5
    pick = lambda override, default: default if override is None else override  # noqa: E731
    return pick(flavor.init_std, std), pick(flavor.embed_std, embed), pick(flavor.head_std, head)


def swiglu_hidden(d_model: int) -> int:
    """SwiGLU hidden size whose three d×h matrices hold as many weights as GELU's two d×4d:
    3·d·h = 8·d², h = 8d/3, rounded to a multiple of 8 (within 1% of the GELU MLP for d ≥ 64)."""
    return max(8, 8 * round(8 * d_model / 3 / 8))
