"""Documents and windows: which tokens may attend to which (posenc/nn/mask.py, nn/layout.py).

Properties a researcher relies on: positions restart at 0 in every document; a window hides
exactly the tokens beyond it (sliding or chunked); layouts give each layer kind its encoding.
For every encoding, `posenc check` (run on each in tests/test_check.py) checks that a packed
document is computed as the document alone, that through L sliding layers nothing beyond
L·(w−1) tokens reaches a logit, and every attention path under document and window masks
against the float64 reference.
"""

from __future__ import annotations

import functools

import pytest
import torch

from posenc.build import build_model
from posenc.config import compose
from posenc.nn.mask import Window, document_positions

V, T = 64, 24
# three documents in the first row (7 + 10 + 7 tokens), two in the second (15 + 9)
DOC = torch.tensor([[0] * 7 + [1] * 10 + [2] * 7, [0] * 15 + [1] * 9])


@functools.cache
def config(name: str, *extra: str):
    return compose([f"encoding={name}", "model.n_layer=2", "model.n_head=4", "model.d_model=32",
                    "trainer.seq_len=64", *extra])


def model_of(name: str, *extra: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(config(name, *extra), vocab_size=V).double().eval()
    for p in model.encoding.parameters():  # T5's table and CoPE's e start at zero: make them visible
        torch.nn.init.normal_(p, std=0.5)
    return model


def tokens(seed: int = 0, shape=(2, T)) -> torch.Tensor:
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


# --- documents -------------------------------------------------------------------------
def test_positions_restart_at_zero_in_every_document():
    pos = document_positions(DOC)
    assert pos[0].tolist() == list(range(7)) + list(range(10)) + list(range(7))
    starts = torch.ones_like(DOC, dtype=torch.bool)
    starts[:, 1:] = DOC[:, 1:] != DOC[:, :-1]
    assert (pos[starts] == 0).all() and (pos[~starts] > 0).all()


# --- windows ---------------------------------------------------------------------------
def logits_with_change(model, x: torch.Tensor, where: int) -> tuple[torch.Tensor, torch.Tensor]:
    changed = x.clone()
    changed[:, where] = (changed[:, where] + 1) % V
    with torch.no_grad():
        return model(x)[0], model(changed)[0]


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5_bias", "learned", "cope", "fire"])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_window_hides_exactly_the_tokens_beyond_it(name, chunked):
    """One layer with a window of W: query i sees i-W+1..i (sliding) or its own chunk of W
    tokens (chunked); a change to any token it cannot see leaves its logits alone, a change to
    the oldest token it can see does not."""
    W = 5
    model = model_of(name, "model.n_layer=1", "layout=sliding", f"layout.window={W}",
                     f"layout.kinds.local.chunked={str(chunked).lower()}")
    x = tokens()
    i = 17
    first_seen = (i // W) * W if chunked else i - W + 1
    a, b = logits_with_change(model, x, first_seen - 1)
    torch.testing.assert_close(a[:, i], b[:, i])
    a, b = logits_with_change(model, x, first_seen)
    assert not torch.allclose(a[:, i], b[:, i])


@pytest.mark.parametrize("name", ["rope", "alibi", "t5_bias", "cope"])
def test_a_window_as_long_as_the_sequence_is_full_attention(name):
    full = model_of(name)
    windowed = model_of(name, "layout=sliding", f"layout.window={T}")
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(windowed(x)[0], full(x)[0])


def test_gemma3_layout_gives_local_and_global_layers_their_own_rope_base():
    model = model_of("rope", "model.n_layer=6", "layout=gemma3", "layout.window=8")
    assert model.layout.kinds == ["local"] * 5 + ["global"]
    assert [model.encoding.for_layer(l).base for l in (0, 5)] == [10000.0, 1000000.0]
    small = model_of("rope", "model.n_layer=4", "layout=gemma3", "layout.window=8")
    assert small.layout.kinds == ["local"] * 3 + ["global"]  # anchored at the last layer


def test_llama4_layout_has_global_nope_layers_and_chunked_rope_layers():
    model = model_of("rope", "model.n_layer=4", "layout=llama4", "layout.window=8")
    assert [model.encoding.for_layer(l).name for l in range(4)] == ["rope", "rope", "rope", "nope"]
    assert model.layout.window(0) == Window(8, chunked=True) and model.layout.window(3).size is None


def test_an_additive_encoding_cannot_differ_per_layer():
    from posenc.errors import UserError

    with pytest.raises(UserError, match="cannot differ per layer kind"):
        build_model(compose(["encoding=learned", "layout=llama4", "model.n_layer=4"]), vocab_size=V)
