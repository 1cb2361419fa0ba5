"""ALiBi (Press et al., 2022): slopes, bias m_h·(j−i), and that it needs no position table."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.nn.encodings.alibi import ALiBi, alibi_slopes


def reference_get_slopes(n: int) -> list[float]:
    """The paper's reference code (ofirpress/attention_with_linear_biases, fairseq)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + reference_get_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2
    ]


def test_slopes_for_8_heads_are_powers_of_one_half():
    assert alibi_slopes(8) == pytest.approx([2.0**-h for h in range(1, 9)])


def test_slopes_for_12_heads_interleave_as_the_paper():
    # 8 heads' slopes 2^-1..2^-8, then every other slope of the 16-head set: 2^-0.5, 2^-1.5, ...
    expected = [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12) == pytest.approx(expected)
    for n in (1, 2, 3, 5, 6, 12, 16, 20, 24):
        assert alibi_slopes(n) == pytest.approx(reference_get_slopes(n))


def test_bias_is_slope_times_key_minus_query():
    enc = ALiBi(d_model=32, n_head=4)
    pos = torch.arange(6)
    bias = enc.position_bias(pos, pos)  # (H, T, T)
    slopes = torch.tensor(alibi_slopes(4))
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert bias[h, i, j].item() == pytest.approx(slopes[h].item() * (j - i))
    assert enc.offers("position_bias") and enc.max_len is None
    assert list(enc.state_dict()) == []  # fixed slopes: nothing learned, nothing saved


@pytest.mark.parametrize("n_head", [8, 12, 16, 6])
def test_bias_equals_blooms_alibi_up_to_a_per_query_constant(n_head):
    """BLOOM's build_alibi_tensor adds m_h·j (key position j) to every query's scores; posenc adds
    m_h·(j − i). Softmax cannot tell them apart: they differ by m_h·i, constant along a query's row."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    T = 40
    theirs = bloom.build_alibi_tensor(torch.ones(1, T), n_head, torch.float32)[:, 0, :]  # (H, T): m_h·j
    ours = ALiBi(d_model=8 * n_head, n_head=n_head).position_bias(torch.arange(T), torch.arange(T))  # (H, T, T)
    causal = torch.ones(T, T).tril().bool()
    expected = (theirs[:, None, :] - theirs[:, :, None])  # m_h·j − m_h·i
    torch.testing.assert_close(ours[:, causal], expected[:, causal])
    bloom_scores = theirs[:, None, :].expand(n_head, T, T)  # every query row gets m_h·j
    torch.testing.assert_close(torch.softmax(ours.masked_fill(~causal, -torch.inf), -1),
                               torch.softmax(bloom_scores.masked_fill(~causal, -torch.inf), -1))
