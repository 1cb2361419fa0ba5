"""Encodings that break the contract on purpose, as a researcher's plug-in might, and one that keeps it
while behaving otherwise in training. Module text, written into a plug-in directory by each test:

- WINDOW_LENGTH: a bias that reads the window's length. tests/test_check.py holds `posenc check` to
  catching it (the prefix row), tests/test_leaderboard.py holds `posenc leaderboard` to refusing it;
- TRAINING_LEAK: the mean of the whole window added to the embeddings in training only (the causal
  row fails, naming training);
- RANDOM_POSITIONS: RoPE at random positions in training (Ruoss et al., 2023), which passes;
- KERNEL_ALIBI: a learned-slope ALiBi with a kernel of its own (fused_attention); kernel_factor=2 is a
  kernel whose slopes are twice its own distance_bias's (the fused-kernel row fails, naming it);
- ACTIVATION_DTYPE_ROPE: RoPE whose angles are computed in the activations' dtype (exact in float32,
  rounded in bf16: the precision rows fail, naming bfloat16);
- BATCH_MEAN_ROPE: RoPE that adds the batch's running mean of keys to each query (the batch row fails);
- UNSEEDED_ROPE: RoPE whose frequencies come from a generator seeded by the OS into a non-persistent
  buffer: every build of the model, in every process, rotates by other frequencies, and no checkpoint
  holds them (tests/test_proof.py: eval of its run warns, naming the buffer);
- UNROTATED_CACHE: RoPE whose decoding cache keeps its keys as they came, unrotated (the decoding row
  fails, naming what the cache keeps).
"""

IMPORTS = """import math

import torch
from torch import nn

from posenc.nn.encodings.base import PositionalEncoding
"""

WINDOW_LENGTH = '''
class WindowLength(PositionalEncoding):
    """b_h(i, j) = -s_h·(i - j)(T - i)/T with T the number of queries it is given: causal, and
    wrong (it reads the window's length)."""

    def __init__(self, d_model: int, n_head: int, name: str = "window_length") -> None:
        super().__init__(d_model, n_head, name)
        self.slope = nn.Parameter(torch.ones(n_head))

    def position_bias(self, q_pos, k_pos):
        T = q_pos.shape[-1]
        n = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0).to(self.slope.dtype)
        return -self.slope[:, None, None] * (n * (T - q_pos[..., :, None]).to(self.slope.dtype) / T).unsqueeze(-3)
'''

TRAINING_LEAK = '''
class TrainingLeak(PositionalEncoding):
    """A learned absolute table that, in training only, adds the mean of the whole window's embeddings:
    every token then sees its future while the model trains, and never while it is evaluated."""

    def __init__(self, d_model: int, n_head: int, name: str = "training_leak", max_len: int = 4096) -> None:
        super().__init__(d_model, n_head, name)
        self.table = nn.Parameter(0.02 * torch.randn(max_len, d_model))

    def embed(self, x, ctx):
        x = x + self.table[ctx.pos]
        return x + x.mean(dim=1, keepdim=True) if self.training else x  # (B, 1, C): the future, in training
'''

RANDOM_POSITIONS = '''
import dataclasses

from posenc.nn.encodings.rope import RoPE


class RandomPositionsRoPE(RoPE):
    """RoPE at randomised positions (Ruoss et al., 2023, "Randomized Positional Encodings Boost Length
    Generalization of Transformers"): in training, the positions 0..n-1 of a forward are mapped to a
    sorted random subset of [0, max_position), drawn once per forward (in prepare); in evaluation the
    positions are themselves. A legitimate difference between training and evaluation."""

    def __init__(self, d_model: int, n_head: int, name: str = "random_rope", max_position: int = 256,
                 subset_seed: int = 0, **kwargs) -> None:
        super().__init__(d_model, n_head, name, **kwargs)
        self.max_position = max_position
        self.subset_seed = subset_seed  # an option of the subclass, recorded with RoPE's own
        self.sampled = torch.arange(max_position)

    def prepare(self, length: int) -> None:
        super().prepare(self.max_position if self.training else length)
        if self.training:  # a sorted random subset of [0, L_max): one draw per forward
            self.sampled = torch.randperm(self.max_position)[:length].sort().values

    def transform_qk(self, q, k, ctx, layer=0):
        if self.training:
            ctx = dataclasses.replace(ctx, pos=self.sampled.to(ctx.pos.device)[ctx.pos],
                                      n_positions=self.max_position, default_positions=False)
        return super().transform_qk(q, k, ctx, layer)
'''

KERNEL_ALIBI = '''
import torch.nn.functional as F


class KernelALiBi(PositionalEncoding):
    """b_h(n) = -m_h·n with learned slopes m_h, and a kernel of its own (fused_attention): SDPA with the
    bias folded into a float mask. kernel_factor 2 is a broken kernel: its slopes are twice distance_bias's."""

    def __init__(self, d_model: int, n_head: int, name: str = "kernel_alibi", kernel_factor: float = 1.0) -> None:
        super().__init__(d_model, n_head, name)
        self.log_slope = nn.Parameter(-8.0 * torch.arange(1, n_head + 1) / n_head * math.log(2.0))  # 2^(-8h/H)
        self.kernel_factor = kernel_factor

    def distance_bias(self, distance):  # (R,) -> (H, R)
        return -self.log_slope.exp()[:, None] * distance.to(self.log_slope.dtype)[None, :]

    def fused_attention(self, ctx, layer=0, log_gates=False):
        if log_gates:
            return None  # it adds no forget gates

        def kernel(q, k, v, ctx, layer, log_gates):
            T = q.shape[-2]
            i = torch.arange(T, device=q.device)
            n = (i[:, None] - i[None, :]).clamp(min=0)  # window indices: i - j inside a document
            slopes = self.kernel_factor * self.log_slope.exp()
            bias = -slopes[:, None, None] * n.to(q.dtype)  # (H, T, T)
            visible = ctx.mask(layer).visible(0, T, 0, T, device=q.device)  # (B|1, 1, T, T)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~visible, float("-inf")))

        return kernel
'''

ACTIVATION_DTYPE_ROPE = '''
from posenc.nn.encodings.rope import RoPE, apply_rotary


class ActivationDtypeRoPE(RoPE):
    """RoPE whose angles m·θ_i are computed in the activations' dtype (q's): exact in float32 and
    float64, and in bf16 (8 bits of mantissa) positions past 256 rounded and every angle rounded to
    1 part in 256 of itself."""

    def transform_qk(self, q, k, ctx, layer=0):
        theta = ctx.pos.to(q.dtype)[..., None] * self.inv_freq.to(q.dtype)  # (T, rot/2) in q's dtype
        cos, sin = theta.cos() * self.attention_scale, theta.sin() * self.attention_scale
        if ctx.per_sequence:
            cos, sin = cos[:, None], sin[:, None]
        return apply_rotary(q, cos, sin, self.style), apply_rotary(k, cos, sin, self.style)
'''

BATCH_MEAN_ROPE = '''
from posenc.nn.encodings.rope import RoPE


class BatchMeanRoPE(RoPE):
    """RoPE that adds to each query the running mean of the batch's keys up to its position: causal
    (keys j <= i only), and every sequence reads the others of its batch."""

    def transform_qk(self, q, k, ctx, layer=0):
        q, k = super().transform_qk(q, k, ctx, layer)
        seen = torch.arange(1, k.shape[-2] + 1, dtype=k.dtype, device=k.device)[:, None]  # (T, 1)
        return q + k.mean(0, keepdim=True).cumsum(-2) / seen, k  # (1, H, T, E): over the batch and j <= i
'''

UNSEEDED_ROPE = '''
from posenc.nn.encodings.rope import RoPE


class UnseededRoPE(RoPE):
    """RoPE at frequencies θ_i = base^(-e_i) with the exponents e_i drawn uniformly from [0, 1) by a
    generator the run's seed never reaches, kept where checkpoints leave it out (persistent=False)."""

    def __init__(self, d_model: int, n_head: int, name: str = "unseeded_rope", **kwargs) -> None:
        super().__init__(d_model, n_head, name, **kwargs)
        draw = torch.Generator()
        draw.seed()  # from the OS: another draw in every build
        exponents = torch.rand(self.rot_dim // 2, generator=draw).sort().values
        self.register_buffer("drawn_freq", self.base ** -exponents, persistent=False)

    def angles(self, pos):
        return pos.to(torch.float32)[:, None] * self.drawn_freq[None, :]
'''

UNROTATED_CACHE = '''
from posenc.nn.encodings.cache import KeysAtPositions
from posenc.nn.encodings.rope import RoPE


class UnrotatedKeys(KeysAtPositions):
    """A cache that forgets what RoPE does to a key: the query is rotated, the kept key is not."""

    keeps = "keys as they came (unrotated), values"

    def transform(self, q, k, ctx):
        return super().transform(q, k, ctx)[0], k


class UnrotatedCacheRoPE(RoPE):
    """RoPE whose decoding cache keeps its keys unrotated, as a plug-in with a cache of its own might."""

    def kv_cache(self, layer, window):
        return UnrotatedKeys(self, layer, window)
'''
