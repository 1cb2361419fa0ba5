"""The GPT with every encoding, built from the configs users use. Causality, the loss at init and
the default positions of every encoding: `posenc check`, run on each in tests/test_check.py."""

import torch
from hydra import compose, initialize_config_module

from posenc.config import CONFIG_MODULE, group_options
from posenc.build import build_model

ENCODINGS = group_options("encoding")


def tiny_model(encoding: str, **overrides):
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        args = [f"encoding={encoding}", "model.n_layer=2", "model.d_model=64", "model.n_head=4", "trainer.seq_len=64"]
        cfg = compose("config", overrides=args + [f"{k}={v}" for k, v in overrides.items()])
    torch.manual_seed(0)
    return build_model(cfg, vocab_size=256).eval()


def test_the_five_encodings_of_the_core_exist():
    assert {"sinusoidal", "learned", "t5_bias", "rope", "nope"} <= set(ENCODINGS)


def test_encodings_differ_only_in_their_own_parameters():
    """Same seed, same model: the non-encoding parameter count is identical for every encoding."""
    counts = {}
    for encoding in ENCODINGS:
        model = tiny_model(encoding)
        counts[encoding] = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoding."))
    assert len(set(counts.values())) == 1, counts


def test_rope_options_reach_the_encoding():
    """What the user typed is what rotates: base 500 sets θ_i = 500^(-2i/d) on the rotated
    dims, and fraction 0.5 of head_dim 16 rotates 8 dims and leaves the other 8 alone."""
    from posenc.nn.encodings.base import Context

    model = tiny_model("rope", **{"encoding.base": 500, "encoding.style": "half", "encoding.fraction": 0.5})
    enc = model.encoding
    assert (enc.base, enc.fraction, enc.style) == (500.0, 0.5, "half")
    torch.testing.assert_close(enc.inv_freq, 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    q = torch.randn(1, 4, 10, 16)
    enc.prepare(10)
    rotated, _ = enc.transform_qk(q, q, Context.arange(10))
    torch.testing.assert_close(rotated[..., 8:], q[..., 8:])
    assert not torch.allclose(rotated[:, :, 1:, :8], q[:, :, 1:, :8])  # position 0 is not rotated


def test_weights_are_tied_in_the_gpt2_flavor():
    model = tiny_model("nope", **{"model.flavor": "gpt2"})
    assert model.lm_head.weight is model.wte.weight
