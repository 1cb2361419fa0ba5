"""Model flavours: every encoding works in every block recipe, and each recipe is what it claims."""

import math

import pytest
import torch
from hydra import compose, initialize_config_module

from posenc.build import build_model
from posenc.config import CONFIG_MODULE, group_options
from posenc.nn.flavors import FLAVORS

ENCODINGS = group_options("encoding")
L, H, D, T, VOCAB = 2, 4, 64, 64, 256


def tiny_model(encoding: str, flavor: str):
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("config", overrides=[f"encoding={encoding}", f"model.flavor={flavor}", f"model.n_layer={L}",
                                           f"model.d_model={D}", f"model.n_head={H}", f"trainer.seq_len={T}"])
    torch.manual_seed(0)
    return build_model(cfg, vocab_size=VOCAB).eval()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_in_every_flavor_is_causal_and_starts_at_ln_vocab(encoding, flavor):
    model = tiny_model(encoding, flavor)
    assert model.flavor.name == flavor
    torch.manual_seed(1)
    idx, targets = torch.randint(0, VOCAB, (2, 48)), torch.randint(0, VOCAB, (2, 48))
    t = 20
    changed = idx.clone()
    changed[:, t + 1] = (idx[:, t + 1] + 1) % VOCAB  # only token t+1 changes
    with torch.no_grad():
        a, loss = model(idx, targets)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])
    # an untrained model knows nothing: cross-entropy ≈ ln(vocab), the uniform guess, plus about
    # s²/2 nats for logits of std s (llama's fan-in head starts at s ≈ 1/√3: 0.17 nats, ±0.1 from
    # seed to seed, so the bound is on the excess beyond s²/2, not on 0.17 ± 0.1 itself)
    assert abs(loss.item() - math.log(VOCAB) - a.var().item() / 2) < 0.15


def test_llama_has_no_biases_and_an_untied_head():
    model = tiny_model("rope", "llama")
    assert not [n for n, _ in model.named_parameters() if n.endswith(".bias") and not n.startswith("encoding.")]
    assert model.lm_head.weight is not model.wte.weight
    assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()


def test_gpt2_keeps_nanogpts_recipe():
    model = tiny_model("rope", "gpt2")
    assert model.lm_head.weight is model.wte.weight
    assert isinstance(model.blocks[0].ln_1, torch.nn.LayerNorm) and model.blocks[0].ln_1.bias is not None
    assert model.blocks[0].attn.c_attn.bias is not None
    # GPT-2's init: std 0.02, residual projections 0.02/√(2L)
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in model.blocks])
    assert abs(proj.std().item() - 0.02 / math.sqrt(2 * L)) < 0.002


@pytest.mark.parametrize("d_model", [64, 128, 256, 768])
def test_swiglu_holds_as_many_parameters_as_the_gelu_mlp(d_model):
    gelu = 2 * d_model * 4 * d_model  # W1: d×4d, W2: 4d×d
    swiglu = tiny_mlp_params(d_model)
    assert abs(swiglu - gelu) / gelu < 0.02


def tiny_mlp_params(d_model: int) -> int:
    from posenc.nn.blocks import SwiGLU

    return sum(p.numel() for p in SwiGLU(d_model, 0.0, bias=False).parameters())


def measured_flops_per_token(model, seq_len: int) -> float:
    """The matmul FLOPs of one forward and backward pass per token, counted by PyTorch's
    FlopCounterMode (attention through SDPA's math backend, so its two T×T matmuls are counted)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    idx = torch.randint(0, VOCAB, (2, seq_len), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    return counter.get_total_flops() / idx.numel()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("seq_len", [T, 2 * T])
def test_flops_per_token_is_what_a_training_step_computes(flavor, seq_len):
    """6N + 12·L·d·T (PaLM, appendix B) against the FLOPs PyTorch counts in a real forward and
    backward: equal up to the bias and norm vectors nanoGPT's N also counts (elementwise, not
    matmuls: under 2% here), never below the count."""
    model = tiny_model("alibi", flavor)  # no RoPE elementwise work, no position table: the matmuls alone
    measured = measured_flops_per_token(model, seq_len)
    assert measured <= model.flops_per_token(seq_len) <= 1.02 * measured


def test_unknown_flavor_is_a_user_error_naming_the_choices():
    from posenc.errors import UserError

    with pytest.raises(UserError, match="model.flavor must be one of gpt2, llama"):
        tiny_model("rope", "mistral")


def test_rmsnorm_is_torchs():
    from posenc.nn.blocks import RMSNorm

    torch.manual_seed(0)
    ours, theirs = RMSNorm(64), torch.nn.RMSNorm(64, eps=1e-6)
    torch.nn.init.normal_(ours.weight)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 64) * 100
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
