"""Documents and windows: which tokens may attend to which (posenc/nn/mask.py, nn/layout.py).

Properties a researcher relies on: under document masking a packed document is computed exactly
as the same document alone (no token sees another document, positions restart at 0), for every
encoding; a window hides exactly the tokens beyond it; and every attention path, with document
and window masks, equals softmax(q·kᵀ/√d + bias + content) v written out in float64 with a mask
built here from the definitions.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from attention_reference import reference
from posenc.build import build_model
from posenc.config import compose, group_options
from posenc.nn import attention
from posenc.nn.encodings.base import Context
from posenc.nn.mask import AttentionMask, Window, document_positions

ENCODINGS = group_options("encoding")
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


@pytest.mark.parametrize("name", ENCODINGS)
def test_a_packed_document_is_computed_as_the_document_alone(name):
    """Every encoding: the logits of the second document of a packed window equal those of the
    same tokens run alone (positions from 0, nothing else to see)."""
    model = model_of(name)
    x = tokens()
    with torch.no_grad():
        packed, _ = model(x, doc=DOC)
        alone, _ = model(x[:1, 7:17])
        torch.testing.assert_close(packed[:1, 7:17], alone)
        second, _ = model(x[1:, 15:])
        torch.testing.assert_close(packed[1:, 15:], second)


@pytest.mark.parametrize("name", ENCODINGS)
def test_changing_another_document_leaves_a_documents_logits_alone(name):
    model = model_of(name)
    x = tokens()
    changed = x.clone()
    changed[0, :7] = (changed[0, :7] + 1) % V  # the document before
    changed[0, 17:] = (changed[0, 17:] + 1) % V  # and the one after
    with torch.no_grad():
        a, _ = model(x, doc=DOC)
        b, _ = model(changed, doc=DOC)
        torch.testing.assert_close(a[0, 7:17], b[0, 7:17])
        assert not torch.allclose(a[0, 17:], b[0, 17:])  # the changed document itself does change
        plain, _ = model(changed)  # without the mask the middle document sees the change
        plain_x, _ = model(x)
        assert not torch.allclose(plain[0, 7:17], plain_x[0, 7:17])


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


def test_layers_stack_their_windows():
    """Through L sliding-window layers a token reaches L·(W-1) tokens back, and no further."""
    W, L = 4, 3
    model = model_of("rope", f"model.n_layer={L}", "layout=sliding", f"layout.window={W}")
    x = tokens()
    i = 20
    a, b = logits_with_change(model, x, i - L * (W - 1) - 1)
    torch.testing.assert_close(a[:, i], b[:, i])
    a, b = logits_with_change(model, x, i - L * (W - 1))
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


# --- every path against the float64 reference -------------------------------------------
def visible_reference(doc: torch.Tensor | None, window: Window, B: int) -> torch.Tensor:
    """(B, 1, T, T): key j visible to query i, from the definitions, pair by pair."""
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                same_doc = doc is None or doc[b, i] == doc[b, j]
                if window.size is None:
                    inside = True
                elif window.chunked:
                    inside = i // window.size == j // window.size
                else:
                    inside = i - j < window.size
                out[b, 0, i, j] = same_doc and inside
    return out


MASKS = [(True, Window()), (False, Window(5)), (True, Window(5)), (True, Window(4, chunked=True))]


@pytest.mark.parametrize(("documents", "window"), MASKS, ids=["documents", "sliding", "documents+sliding",
                                                                  "documents+chunk"])
@pytest.mark.parametrize("name", ENCODINGS)
def test_every_cpu_path_with_documents_and_windows_equals_the_float64_reference(name, documents, window,
                                                                                 monkeypatch):
    """The reference computes the bias at each token's position inside its document (B, H, T, T);
    attention may compute it otherwise (at window indices for a bias of i - j alone). Every other
    term (content, decays, logit scale, sink, normaliser) is the encoding's own, under this mask."""
    encoding = model_of(name).encoding
    B, H, HD = 2, 4, 8
    doc = DOC if documents else None
    pos = document_positions(DOC) if documents else torch.arange(T)
    mask = AttentionMask(T, doc, window)
    ctx = Context.at(pos, torch.float64, doc, (mask,), n_positions=T) if documents else \
        Context.arange(T, dtype=torch.float64, masks=(mask,))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, T, HD, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(B, T, H * HD, generator=g, dtype=torch.float64)  # the block's input (FoX's gates)
    encoding.prepare(T)
    q, k, terms = attention.encode(encoding, q, k, ctx.with_input(x), 0)
    extra = encoding.position_bias(pos, pos).double() if encoding.has_position_bias else None
    expected = reference(q, k, v, visible_reference(doc, window, B), extra, terms)
    torch.testing.assert_close(attention.attend(q, k, v, attention.plan(encoding, ctx, 0, 0.0), terms=terms),
                               expected)
    monkeypatch.setattr(attention, "DENSE_MAX_LEN", 0)  # the long-sequence path: query chunks of 5
    monkeypatch.setattr(attention, "QUERY_CHUNK", 5)
    chunked = attention.plan(encoding, ctx, 0, 0.0)
    torch.testing.assert_close(attention.attend(q, k, v, chunked, terms=terms), expected)


@pytest.mark.parametrize(("documents", "window"), MASKS[:3], ids=["documents", "sliding", "documents+sliding"])
@pytest.mark.parametrize("name", ["nope", "alibi", "t5_bias", "kerple", "fire"])
def test_flex_block_mask_with_documents_and_windows_equals_the_reference(name, documents, window):
    """What CUDA runs, eagerly on CPU (forward only): the score_mod and the mask's BlockMask."""
    from torch.nn.attention.flex_attention import flex_attention

    encoding = model_of(name).encoding
    B, H, HD = 2, 4, 8
    doc = DOC if documents else None
    pos = document_positions(DOC) if documents else torch.arange(T)
    mask = AttentionMask(T, doc, window)
    ctx = Context.at(pos, torch.float64, doc, (mask,), n_positions=T) if documents else \
        Context.arange(T, dtype=torch.float64, masks=(mask,))
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, T, HD, generator=g, dtype=torch.float64) for _ in range(3))
    encoding.prepare(T)
    bias_ctx = ctx.at_indices() if documents and encoding.is_relative else ctx
    score_mod = encoding.score_mod(bias_ctx) if encoding.has_position_bias else None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is slow: it is a check
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=mask.block_mask(torch.device("cpu")))
    extra = encoding.position_bias(pos, pos).double() if encoding.has_position_bias else None
    torch.testing.assert_close(out, reference(q, k, v, visible_reference(doc, window, B), extra))
