"""Absolute encodings: Vaswani's sinusoid and GPT-2's learned table."""

import math

import pytest
import torch

from posenc.nn.encodings.base import Context, PositionOutOfRange
from posenc.nn.encodings.learned import Learned
from posenc.nn.encodings.sinusoidal import Sinusoidal, sinusoidal_table


def test_sinusoid_matches_vaswani():
    d = 16
    pe = sinusoidal_table(torch.arange(50), d)
    for p in (0, 1, 7, 49):
        for i in range(d // 2):
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / d)), abs=1e-5)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / d)), abs=1e-5)


def test_sinusoidal_is_added_to_the_embeddings():
    enc = Sinusoidal(d_model=8, n_head=2, scale_embeddings=False)
    x = torch.zeros(1, 5, 8)
    enc.prepare(5)
    torch.testing.assert_close(enc.embed(x, Context.arange(5))[0], sinusoidal_table(torch.arange(5), 8))
    enc.prepare(100_000)  # any length: the sinusoid is defined everywhere
    assert enc.max_len is None


def test_learned_refuses_position_max_len():
    enc = Learned(d_model=8, n_head=2, max_len=16)
    enc.prepare(16)  # positions 0..15: fine
    with pytest.raises(PositionOutOfRange, match="max_len=16"):
        enc.prepare(17)  # position 16 has no row: refused, not clamped or an IndexError


def test_learned_model_refuses_long_sequences():
    from posenc.nn.model import GPT

    model = GPT(vocab_size=256, encoding=Learned(d_model=32, n_head=2, max_len=8), n_layer=1, n_head=2, d_model=32)
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(PositionOutOfRange):
        model(torch.zeros(1, 9, dtype=torch.long))
