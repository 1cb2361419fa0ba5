"""T5's relative position buckets (Raffel et al., 2020; Mesh TensorFlow), causal case."""

import math

import torch

from posenc.nn.encodings.t5_bias import T5Bias, relative_position_bucket

NB, MD = 32, 128


def bucket(distance_back: int) -> int:
    """Bucket of a key `distance_back` positions before the query (relative = key - query)."""
    return int(relative_position_bucket(torch.tensor([-distance_back]), False, NB, MD)[0])


def test_exact_below_half_the_buckets():
    assert [bucket(n) for n in range(NB // 2)] == list(range(NB // 2))


def test_logarithmic_up_to_max_distance():
    max_exact = NB // 2
    for n in range(max_exact, MD):
        expected = max_exact + int(math.log(n / max_exact) / math.log(MD / max_exact) * (NB - max_exact))
        assert bucket(n) == min(expected, NB - 1)
    buckets = [bucket(n) for n in range(MD)]
    assert buckets == sorted(buckets)  # monotone in distance
    # logarithmic: doubling the distance adds a constant number of buckets
    assert bucket(32) - bucket(16) == bucket(64) - bucket(32) > 1


def test_clamped_after_max_distance():
    assert bucket(MD) == NB - 1
    assert {bucket(n) for n in (MD, 2 * MD, 10_000)} == {NB - 1}


def test_future_positions_share_bucket_zero_in_the_causal_case():
    future = relative_position_bucket(torch.arange(1, 50), False, NB, MD)
    assert torch.all(future == 0)
    # bidirectional: the future gets buckets of its own
    bi = relative_position_bucket(torch.arange(1, 50), True, NB, MD)
    assert torch.all(bi >= NB // 2)


def test_bias_is_one_learned_scalar_per_bucket_per_head():
    enc = T5Bias(d_model=32, n_head=4)
    with torch.no_grad():
        enc.relative_attention_bias.weight.copy_(torch.arange(NB * 4, dtype=torch.float32).view(NB, 4))
    pos = torch.arange(300)
    b = enc.bias(pos, pos)
    assert b.shape == (4, 300, 300)
    # depends on (query, key) only through key - query
    torch.testing.assert_close(b[:, 10:20, 0:10], b[:, 110:120, 100:110])
    assert b[2, 5, 5] == enc.relative_attention_bias.weight[0, 2]
    assert b[1, 299, 0] == enc.relative_attention_bias.weight[NB - 1, 1]
    assert sum(p.numel() for p in enc.parameters()) == NB * 4


def test_bias_equals_the_bucket_lookup_for_every_pair():
    """The causal bias gathers from a table over distances 0..max_distance; it must equal
    W[bucket(j - i)] for every query/key pair, far beyond max_distance and in the future too."""
    torch.manual_seed(0)
    enc = T5Bias(d_model=32, n_head=4)
    torch.nn.init.normal_(enc.relative_attention_bias.weight)
    q_pos, k_pos = torch.arange(100, 400), torch.arange(0, 500)
    expected = enc.relative_attention_bias(enc.buckets(q_pos, k_pos)).permute(2, 0, 1)
    torch.testing.assert_close(enc.bias(q_pos, k_pos), expected)
