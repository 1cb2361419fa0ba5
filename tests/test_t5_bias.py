"""T5's relative position buckets (Raffel et al., 2020; Mesh TensorFlow), causal case, and what
makes the comparison fair: a scaled table that learns in posenc's budgets, and no
bucket read beyond the training length that training could not reach."""

import math

import pytest
import torch

from posenc.build import build_encoding, build_model
from posenc.config import compose
from posenc.nn.encodings.t5_bias import T5Bias, relative_position_bucket

NB, MD = 32, 128


def bucket(distance_back: int) -> int:
    """Bucket of a key `distance_back` positions before the query (relative = key - query)."""
    return int(relative_position_bucket(torch.tensor([-distance_back]), False, NB, MD)[0])


def test_exact_below_half_the_buckets():
    assert [bucket(n) for n in range(NB // 2)] == list(range(NB // 2))


def test_logarithmic_up_to_max_distance():
    buckets = [bucket(n) for n in range(MD)]
    assert buckets == sorted(buckets)  # monotone in distance
    # logarithmic: doubling the distance adds a constant number of buckets
    assert bucket(32) - bucket(16) == bucket(64) - bucket(32) > 1


def test_clamped_after_max_distance():
    assert bucket(MD) == NB - 1
    assert {bucket(n) for n in (MD, 2 * MD, 10_000)} == {NB - 1}


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (32, 16), (32, 17), (32, 24), (8, 16), (64, 512)])
def test_buckets_equal_hugging_faces_t5(bidirectional, num_buckets, max_distance):
    """T5's bucketing as Hugging Face's T5Attention computes it, past max_distance and both ways."""
    hf_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-4 * max_distance, 4 * max_distance + 1)
    theirs = hf_t5.T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(relative_position_bucket(relative, bidirectional, num_buckets, max_distance), theirs)


@pytest.mark.parametrize("max_distance", range(8, 65))
def test_the_encodings_clamp_is_hugging_faces_buckets_but_past_max_distance(max_distance):
    """A documented choice (t5_bias.py): distances >= max_distance read the bucket of
    max_distance − 1, the last one training at that length reaches. That is Hugging Face's last
    bucket wherever its log buckets reach it at max_distance − 1 (32 buckets: max_distance >= 29),
    and differs only where they do not: max_distance 17..28, where Hugging Face reads bucket 31,
    which no distance below max_distance trains, and max_distance <= 16 (= num_buckets/2, every
    reachable distance exact), where its log formula divides by ln(max_distance/16) <= 0."""
    hf_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    enc = T5Bias(d_model=32, n_head=4, num_buckets=NB, max_distance=max_distance)
    n = torch.arange(8 * max_distance)
    theirs = hf_t5.T5Attention._relative_position_bucket(-n, False, NB, max_distance)
    ours = enc.bucket(-n)
    inside = n < max_distance
    assert torch.equal(ours[inside], theirs[inside])
    assert torch.all(ours[~inside] == theirs[max_distance - 1])
    if theirs[max_distance - 1] == NB - 1:
        assert torch.equal(ours, theirs)
    else:
        assert max_distance <= 28
        if max_distance > NB // 2:
            assert torch.all(theirs[~inside] == NB - 1)


def test_bias_is_one_learned_scalar_per_bucket_per_head():
    enc = T5Bias(d_model=32, n_head=4, scale=1.0)
    with torch.no_grad():
        enc.relative_attention_bias.weight.copy_(torch.arange(NB * 4, dtype=torch.float32).view(NB, 4))
    pos = torch.arange(300)
    b = enc.position_bias(pos, pos)
    assert b.shape == (4, 300, 300)
    # depends on (query, key) only through key - query
    torch.testing.assert_close(b[:, 10:20, 0:10], b[:, 110:120, 100:110])
    assert b[2, 5, 5] == enc.relative_attention_bias.weight[0, 2]
    assert b[1, 299, 0] == enc.relative_attention_bias.weight[NB - 1, 1]
    assert sum(p.numel() for p in enc.parameters()) == NB * 4
    # the default scale is √head_dim (x-transformers): b = √8 · W
    scaled = T5Bias(d_model=32, n_head=4)
    scaled.load_state_dict(enc.state_dict() | {"scale": torch.tensor(math.sqrt(8))})
    torch.testing.assert_close(scaled.position_bias(pos, pos), math.sqrt(8) * b)


def test_bias_equals_the_bucket_lookup_for_every_pair():
    """The causal bias gathers from a table over distances 0..max_distance - 1; it must equal
    scale · W[bucket(j - i)] for every query/key pair, far beyond max_distance and in the future too."""
    torch.manual_seed(0)
    enc = T5Bias(d_model=32, n_head=4)
    torch.nn.init.normal_(enc.relative_attention_bias.weight)
    q_pos, k_pos = torch.arange(100, 400), torch.arange(0, 500)
    expected = enc.scale * enc.relative_attention_bias(enc.buckets(q_pos, k_pos)).permute(2, 0, 1)
    torch.testing.assert_close(enc.position_bias(q_pos, k_pos), expected)


def copy_task_table_after(scale: float, steps: int = 8, lr: float = 1e-2) -> torch.Tensor:
    """A tiny T5 model trained for a few Adam steps on "repeat the token 3 back" (a task only
    position can solve); returns the learned bias table b_h(n), n < 16."""
    torch.manual_seed(0)
    cfg = compose(["encoding=t5_bias", f"encoding.scale={scale}", "model.n_layer=1", "model.n_head=2",
                   "model.d_model=32", "trainer.seq_len=16"])
    model = build_model(cfg, vocab_size=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(16, (16, 16), generator=g)
        _, loss = model(x[:, 3:], x[:, :-3])  # target at t is the token at t - 3
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.encoding.distance_bias(torch.arange(16)).detach()


def test_the_scaled_table_learns_in_a_few_steps_where_the_unscaled_one_cannot():
    """Adam moves each entry of W by about lr per step, whatever its gradient: after k steps the
    unscaled T5 bias (b = W, zero at init) stays within ~k·lr, while b = √head_dim · W moves
    √head_dim times further: the table learns in posenc's budgets."""
    steps, lr = 8, 1e-2
    bound = 1.1 * steps * lr
    unscaled, scaled = copy_task_table_after(1.0, steps, lr), copy_task_table_after(4.0, steps, lr)
    assert unscaled.abs().max() <= bound
    assert scaled.abs().max() > 2 * bound


@pytest.mark.parametrize("seq_len", [16, 24, 64, 100, 1024])
def test_extrapolation_never_reads_a_bucket_training_cannot_reach(seq_len):
    """With the default config (max_distance = half the training length T), every distance >= T
    reads the bucket of distance T - 1, which training reaches, and that bucket is shared by
    every distance from T/2 on: not a bucket seen by one pair per window."""
    enc = build_encoding(compose(["encoding=t5_bias", f"trainer.seq_len={seq_len}"]))
    beyond = enc.bucket(-torch.arange(seq_len, 16 * seq_len + 1))
    assert torch.all(beyond == enc.bucket(torch.tensor(-(seq_len - 1))))
    trained = set(enc.bucket(-torch.arange(seq_len)).tolist())
    assert set(beyond.tolist()) <= trained
    assert enc.max_distance == seq_len // 2
    assert torch.all(enc.bucket(-torch.arange(seq_len // 2 - 1, seq_len)) == beyond[0])


def test_a_max_distance_beyond_the_training_length_warns_with_what_to_set():
    with pytest.warns(RuntimeWarning, match=r"buckets 27\.\.31 .*set encoding.max_distance to at most 64"):
        build_encoding(compose(["encoding=t5_bias", "trainer.seq_len=64", "encoding.max_distance=128"]))


def test_a_checkpoint_from_before_the_scale_loads_unscaled_as_it_was_trained():
    old = T5Bias(d_model=32, n_head=4)
    state = {"relative_attention_bias.weight": torch.randn(NB, 4)}  # no "scale": written before it existed
    old.load_state_dict(state)
    assert float(old.scale) == 1.0
    pos = torch.arange(8)
    torch.testing.assert_close(old.position_bias(pos, pos)[:, 3, 3], state["relative_attention_bias.weight"][0])
