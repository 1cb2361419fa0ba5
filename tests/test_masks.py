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


def random_documents(B: int, T: int, seed: int) -> torch.Tensor:
    """(B, T) non-decreasing document ids: documents of random lengths, one row a single document."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=g) < 0.02
    starts[:, 0] = True
    starts[-1, 1:] = False  # one window holding a single document
    return starts.long().cumsum(-1)


@pytest.mark.parametrize("T", [1, 100, 128, 300, 1024])
@pytest.mark.parametrize("window", [Window(), Window(1), Window(48), Window(200), Window(64, chunked=True),
                                    Window(100, chunked=True)], ids=str)
@pytest.mark.parametrize("documents", [False, True])
def test_the_block_mask_built_from_block_bounds_is_flex_attentions_own(T, window, documents):
    """posenc builds FlexAttention's BlockMask from each query's first visible key (no T x T mask,
    so the 16x evaluation stays O(T)); torch's create_block_mask, which evaluates the mask_mod at
    every pair, is the reference: the same partial and full blocks, in the same order."""
    from torch.nn.attention.flex_attention import create_block_mask

    from posenc.nn.mask import AttentionMask

    doc = random_documents(3, T, seed=T) if documents else None
    mask = AttentionMask(T, doc, window)
    ours = mask.block_mask(torch.device("cpu"))
    theirs = create_block_mask(mask.mask_mod(), B=None if doc is None else doc.shape[0], H=None, Q_LEN=T, KV_LEN=T,
                               device="cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), msg=name)
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        counts = getattr(theirs, num)
        for row in torch.nonzero(torch.ones_like(counts)):  # only each row's first `count` indices are read
            n = int(counts[tuple(row)])
            assert torch.equal(getattr(ours, idx)[tuple(row)][:n], getattr(theirs, idx)[tuple(row)][:n]), (idx, row)
    assert ours.seq_lengths == theirs.seq_lengths and ours.BLOCK_SIZE == theirs.BLOCK_SIZE
    torch.testing.assert_close(ours.sparsity(), theirs.sparsity())


def test_the_block_mask_of_a_long_evaluation_never_holds_a_t_by_t_tensor():
    """16x the training length of model=small (16,384 tokens): every tensor built for its block masks
    (documents and a window, or causal alone) holds O(T²/128) elements at most, never T x T (torch's
    create_block_mask holds 268 M)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from posenc.nn.mask import AttentionMask

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    T = 16384
    doc = random_documents(1, T, seed=0)
    with Largest():
        AttentionMask(T, doc, Window(256)).block_mask(torch.device("cpu"))
        AttentionMask(T, None, Window()).block_mask(torch.device("cpu"))
    assert 0 < Largest.numel <= T * T // 128, Largest.numel
