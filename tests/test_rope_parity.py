"""RoPE and its context-extension methods against the implementation the field runs: Hugging Face
transformers' ``ROPE_INIT_FUNCTIONS`` (inv_freq and attention factor) and ``LlamaRotaryEmbedding``
+ ``apply_rotary_pos_emb`` (the rotation). Configs are built in code: nothing from the Hub.

posenc's ``original_max_len`` T is Hugging Face's ``original_max_position_embeddings`` (yarn,
llama3, longrope) and, for ``dynamic``, its ``max_position_embeddings``."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
import torch

from posenc.nn.encodings.base import Context
from posenc.nn.encodings.rope import RoPE

if TYPE_CHECKING:
    from transformers import LlamaConfig


@functools.cache
def hf() -> SimpleNamespace:
    """transformers' pieces, imported by the first test that needs them (not at collection: it
    costs every pytest-xdist worker seconds); the test extra installs it."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    return SimpleNamespace(LlamaConfig=LlamaConfig, ROPE_INIT_FUNCTIONS=ROPE_INIT_FUNCTIONS,
                           LlamaRotaryEmbedding=LlamaRotaryEmbedding, apply_rotary_pos_emb=apply_rotary_pos_emb)

#: (base, head_dim, factor s, T): the issue's case, the context-extension study's, Llama 3's base
SHAPES = [(10_000.0, 64, 4.0, 1024), (10_000.0, 32, 4.0, 64), (500_000.0, 128, 8.0, 8192), (10_000.0, 64, 16.0, 256)]
SCALINGS = ["linear", "dynamic", "yarn", "llama3", "longrope"]


def longrope_factors(head_dim: int, s: float) -> tuple[list[float], list[float]]:
    """Lists with the shape of LongRoPE's searched ones: 1 .. s rising over the pairs (long), and
    a short list that is not all ones, so a mix-up between the two would show."""
    pairs = head_dim // 2
    long = [s ** (i / (pairs - 1)) for i in range(pairs)]
    short = [1.0 + 0.5 * i / (pairs - 1) for i in range(pairs)]
    return short, long


def options(scaling: str, head_dim: int, s: float) -> dict:
    """The method's own keys, the same values for posenc and Hugging Face."""
    if scaling == "llama3":
        return {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    if scaling == "longrope":
        short, long = longrope_factors(head_dim, s)
        return {"short_factor": short, "long_factor": long}
    return {}


def hf_config(scaling: str, base: float, head_dim: int, s: float, T: int, **extra) -> LlamaConfig:
    """A LlamaConfig whose rope_parameters say what posenc's encoding.* say."""
    params = {"rope_type": scaling, "rope_theta": base, "factor": s, **options(scaling, head_dim, s), **extra}
    if scaling == "dynamic":  # dynamic reads the training length from max_position_embeddings
        max_pos = T
    else:
        params["original_max_position_embeddings"] = T
        max_pos = int(s * T)
    return hf().LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                       max_position_embeddings=max_pos, rope_parameters=params)


def posenc_rope(scaling: str, base: float, head_dim: int, s: float, T: int, style: str = "interleaved",
                **extra) -> RoPE:
    return RoPE(2 * head_dim, 2, base=base, style=style, scaling=scaling, scaling_factor=s, original_max_len=T,
                **options(scaling, head_dim, s), **extra)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "base{:g}_hd{}_s{:g}_T{}".format(*s))
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("where", ["inside", "beyond"])
def test_inv_freq_and_attention_factor_equal_hugging_faces(scaling, shape, where):
    base, head_dim, s, T = shape
    length = T // 2 if where == "inside" else 3 * T  # a length inside the original, and one past it
    ours = posenc_rope(scaling, base, head_dim, s, T)
    ours.prepare(length)
    theirs, factor = hf().ROPE_INIT_FUNCTIONS[scaling](hf_config(scaling, base, head_dim, s, T), "cpu", seq_len=length)
    torch.testing.assert_close(ours.inv_freq, theirs, rtol=2e-6, atol=0)
    assert ours.attention_scale == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("extra", [{"truncate": False}, {"beta_fast": 16.0, "beta_slow": 2.0},
                                   {"mscale": 0.707, "mscale_all_dim": 0.707}, {"mscale": 1.0, "mscale_all_dim": 0.5}],
                         ids=["no_truncate", "betas", "deepseek_mscale", "mscale_ratio"])
def test_yarns_options_mean_what_they_mean_in_hugging_face(extra):
    base, head_dim, s, T = 10_000.0, 64, 4.0, 1024
    ours = posenc_rope("yarn", base, head_dim, s, T, **extra)
    theirs, factor = hf().ROPE_INIT_FUNCTIONS["yarn"](hf_config("yarn", base, head_dim, s, T, **extra), "cpu")
    torch.testing.assert_close(ours.inv_freq, theirs, rtol=2e-6, atol=0)
    assert ours.attention_scale == pytest.approx(factor, rel=1e-12)


def hf_rotate(config: LlamaConfig, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaRotaryEmbedding's cos/sin (attention factor folded in) and apply_rotary_pos_emb."""
    T = q.shape[-2]
    position_ids = torch.arange(T)[None]
    cos, sin = hf().LlamaRotaryEmbedding(config)(q, position_ids)
    return hf().apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("scaling", ["default", *SCALINGS])
def test_half_style_rotation_equals_apply_rotary_pos_emb(scaling):
    """style=half is GPT-NeoX/LLaMA's rotate-half: the rotated q and k are Hugging Face's, scaling's
    attention factor included, at a length past the original one."""
    base, head_dim, s, T = 10_000.0, 32, 4.0, 64
    length = 3 * T
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 2, length, head_dim).unbind(0)  # (B, H, T, hd) each
    if scaling == "default":
        ours = RoPE(2 * head_dim, 2, base=base, style="half")
        config = hf().LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                             max_position_embeddings=length, rope_parameters={"rope_type": "default", "rope_theta": base})
    else:
        ours, config = posenc_rope(scaling, base, head_dim, s, T, style="half"), hf_config(scaling, base, head_dim, s, T)
    ours.prepare(length)
    rq, rk = ours.transform_qk(q, k, Context.at(torch.arange(length)))
    hq, hk = hf_rotate(config, q, k)
    # float32 angles m·θ_i of up to ~200 rad carry ~1e-5 rad of rounding (an inv_freq one ulp
    # apart, as longrope's θ/λ against HF's 1/(λ·base^x)): 1e-4 on entries of size ~3 is that,
    # while the ramp YaRN had before differed by up to 7.5
    torch.testing.assert_close(rq, hq, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(rk, hk, rtol=1e-5, atol=1e-4)
