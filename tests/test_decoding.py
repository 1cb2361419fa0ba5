"""Decoding with a KV cache (posenc/nn/decoding.py, posenc/nn/encodings/cache.py): what a user relies on
when a trained model is prompted and continued a token at a time.

The property every encoding and layout must have (the cached logits are the full forward's at every
position, up to 4× the window) is `posenc check`'s decoding row, run over every shipped encoding in
tests/test_check.py. Here: that property at a user's shape (RoPE, head_dim 64, T >= 1024), what each
kind of cache keeps (a window's w keys, a recurrent state's O(1), PaTH's carried keys against the
paper's product of transforms), the fallbacks (a plug-in with hooks only, a subclass that changes a hook
its parent's cache relies on, dynamic NTK beyond its original length), a refusal at max_len, and
sampling.
"""

from __future__ import annotations

import functools

import pytest
import torch

from posenc.build import build_model
from posenc.config import compose
from posenc.nn.decoding import Recompute, generate, sample
from posenc.nn.encodings.base import PositionalEncoding, PositionOutOfRange
from posenc.nn.encodings.cache import KeysAtPositions
from posenc.nn.encodings.householder import carried_to_end
from posenc.nn.encodings.rope import RoPE
from posenc.nn.model import GPT

V = 64
TINY = ["model.n_layer=2", "model.n_head=4", "model.d_model=32", "trainer.seq_len=24"]


@functools.cache
def config(*overrides: str):
    return compose([*TINY, *overrides])


def model_of(*overrides: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = build_model(config(*overrides), vocab_size=V).double().eval()
    with torch.no_grad():  # move every encoding parameter off its (often zero) initialisation
        g = torch.Generator().manual_seed(seed + 1)
        for p in model.encoding.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def decoded(model: GPT, prompt: torch.Tensor, steps: int, chunk: int = 1) -> tuple[torch.Tensor, torch.Tensor, object]:
    """Greedy decoding with a cache, ``chunk`` tokens fed per forward: (the tokens (B, T + steps), the
    cached logits of every token fed (B, T + steps - chunk, V), the cache)."""
    cache = model.new_cache()
    with torch.no_grad():
        logits = [model(prompt, cache=cache)[0]]
        tokens = prompt
        while tokens.shape[1] < prompt.shape[1] + steps:
            new = logits[-1][:, -1:].argmax(-1)
            for _ in range(chunk - 1):  # several tokens in one forward: the next ones chosen from the first
                new = torch.cat((new, (new[:, -1:] + 1) % V), dim=1)
            tokens = torch.cat((tokens, new), dim=1)
            logits.append(model(new, cache=cache)[0])
    return tokens, torch.cat(logits, dim=1), cache


def gap(model: GPT, tokens: torch.Tensor, cached: torch.Tensor) -> float:
    with torch.no_grad():
        full = model(tokens[:, : cached.shape[1]])[0]
    return float((full - cached).abs().max())


def test_rope_decodes_as_its_full_forward_at_a_users_shape():
    """head_dim 64, a prompt of 1000 tokens and 30 more decoded past 1024: the logits of every position
    equal the forward over the whole sequence (float64)."""
    torch.manual_seed(0)
    cfg = compose(["model.n_layer=2", "model.n_head=2", "model.d_model=128", "trainer.seq_len=1024", "encoding=rope"])
    model = build_model(cfg, vocab_size=V).double().eval()
    prompt = torch.randint(V, (1, 1000), generator=torch.Generator().manual_seed(1))
    tokens, cached, cache = decoded(model, prompt, 30)
    assert tokens.shape[1] == 1030 and cache.describe() == [KeysAtPositions.keeps]
    assert gap(model, tokens, cached) < 1e-10


@pytest.mark.parametrize("overrides", [["encoding=alibi"], ["encoding=fox_rope"], ["encoding=path"], ["encoding=cope"],
                                       ["encoding=stick_breaking"], ["layout=qwen3_next"]],
                         ids=lambda o: " ".join(o))
def test_several_tokens_fed_at_once_decode_as_the_full_forward(overrides):
    """A forward of 3 new tokens against the cache (causal among themselves) gives the full forward's logits."""
    model = model_of(*overrides)
    tokens, cached, _ = decoded(model, torch.randint(V, (2, 5), generator=torch.Generator()), 30, chunk=3)
    assert gap(model, tokens, cached) < 1e-10


def test_a_sliding_window_keeps_w_keys_and_a_chunked_one_restarts_at_each_chunk():
    """Mistral's window: after n tokens the cache holds the w - 1 keys the next query sees beside itself,
    however long the sequence grows; Llama 4's chunks: the keys of the current chunk only."""
    for chunked, expected in ((False, lambda n: min(n, 4)), (True, lambda n: n % 5)):
        model = model_of("encoding=rope", "layout=sliding", "layout.window=5", f"layout.kinds.local.chunked={chunked}")
        cache = model.new_cache()
        with torch.no_grad():
            model(torch.randint(V, (1, 7)), cache=cache)
            for n in range(8, 30):
                model(torch.randint(V, (1, 1)), cache=cache)
                assert all(layer.keys.shape[-2] == expected(n) for layer in cache.layers), (chunked, n)


def test_a_recurrent_layer_keeps_a_state_whose_size_does_not_grow():
    model = model_of("layout=qwen3_next")
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(V, (1, 6)), cache=cache)
        recurrent = cache.layers[0]
        size = recurrent.nbytes()
        for _ in range(20):
            model(torch.randint(V, (1, 1)), cache=cache)
    assert recurrent.nbytes() == size and recurrent.S.shape == (1, 4, 8, 8)


def test_paths_carried_keys_are_the_papers_product_of_transforms():
    """k̃_j = H_{T-1} ··· H_{j+1} k_j, H_t = I - β_t w_t w_tᵀ written out as d x d matrices, across chunks."""
    g = torch.Generator().manual_seed(0)
    T, d = 23, 6
    k = torch.randn(1, 2, T, d, generator=g, dtype=torch.float64)
    w = torch.nn.functional.normalize(torch.randn(1, 2, T, d, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(1, 2, T, generator=g, dtype=torch.float64)
    expected = torch.empty_like(k)
    for h in range(2):
        for j in range(T):
            x = k[0, h, j]
            for t in range(j + 1, T):
                x = (torch.eye(d, dtype=x.dtype) - beta[0, h, t] * torch.outer(w[0, h, t], w[0, h, t])) @ x
            expected[0, h, j] = x
    assert torch.allclose(carried_to_end(k, w, beta, chunk=4), expected, atol=1e-12)


PLUGIN_DECAY = '''
class ExponentialGate(PositionalEncoding):
    """A plug-in with hooks only: a per-head decay c_i - c_j from gates of the block's input."""

    def __init__(self, d_model, n_head, name="exp_gate"):
        super().__init__(d_model, n_head, name)
        self.w = torch.nn.Parameter(torch.randn(n_head, d_model) * 0.1)

    def decay(self, ctx, layer=0):
        return torch.nn.functional.logsigmoid(ctx.x @ self.w.T).transpose(1, 2).cumsum(-1)
'''


def test_a_plugin_with_hooks_only_and_a_subclass_that_rotates_otherwise_decode_by_recomputation():
    """An encoding that writes a decay (no cache of its own), and a RoPE subclass that changes transform_qk
    (RoPE's rotated keys would be wrong for it): each layer keeps its raw q, k, v and input, and the
    cached logits are still the full forward's."""
    namespace = {"torch": torch, "PositionalEncoding": PositionalEncoding}
    exec(PLUGIN_DECAY, namespace)  # noqa: S102 - a plug-in's source, as a user would write it

    class Shifted(RoPE):  # RoPE at positions shifted by 3: position-wise, but not RoPE's own transform
        def transform_qk(self, q, k, ctx, layer=0):
            import dataclasses
            return super().transform_qk(q, k, dataclasses.replace(ctx, pos=ctx.pos + 3, default_positions=False), layer)

        def prepare(self, length):
            super().prepare(length + 3)

    for encoding in (namespace["ExponentialGate"](32, 4), Shifted(32, 4)):
        torch.manual_seed(0)
        model = GPT(V, encoding, n_layer=2, n_head=4, d_model=32).double().eval()
        tokens, cached, cache = decoded(model, torch.randint(V, (2, 5)), 25)
        assert cache.describe() == [Recompute.keeps]
        assert gap(model, tokens, cached) < 1e-10


def test_dynamic_ntk_runs_the_sequence_again_once_it_outgrows_its_original_length():
    """Beyond original_max_len every frequency changes with the length, and every layer's past outputs
    with them: decoding starts over from the whole sequence at each new length (the logits at position p
    are the forward of tokens 0..p), and says the cache goes stale there; below it, nothing restarts."""
    model = model_of("encoding=rope", "encoding.scaling=dynamic", "encoding.scaling_factor=2")
    tokens, cached, cache = decoded(model, torch.randint(V, (1, 5)), 30)
    with torch.no_grad():
        worst = max(float((model(tokens[:, : p + 1])[0][:, p] - cached[:, p]).abs().max()) for p in range(34))
    assert worst < 1e-10
    assert cache.restarts == 34 - 24 + 1  # one per length beyond 24
    assert "stale beyond 24" in model.encoding.stale_cache()
    assert model_of("encoding=rope").encoding.stale_cache() is None


def test_learned_positions_refuse_position_max_len_and_the_cache_is_left_as_it_was():
    model = model_of("encoding=learned")  # max_len: the training length, 24
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(V, (1, 24)), cache=cache)
        with pytest.raises(PositionOutOfRange, match="max_len=24"):
            model(torch.randint(V, (1, 1)), cache=cache)
    assert cache.length == 24


def test_sampling_is_greedy_at_temperature_zero_and_reproducible_from_a_seed():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits, 0.0), logits.argmax(-1, keepdim=True))
    assert torch.equal(sample(logits, 1.0, top_k=1), logits.argmax(-1, keepdim=True))
    draws = [sample(logits, 1.0, 5, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(*draws)
    top5 = logits.topk(5).indices
    assert all(int(t) in top5[i].tolist() for i, t in enumerate(draws[0][:, 0]))


def test_generate_streams_the_greedy_continuation():
    model = model_of("encoding=rope")
    prompt = torch.randint(V, (1, 5))
    streamed = torch.cat([token for token, _ in generate(model, prompt, 12)], dim=1)
    tokens, _, _ = decoded(model, prompt, 12)
    assert torch.equal(streamed, tokens[:, 5:])
