"""An encoding that breaks the contract on purpose, as a researcher's plug-in might: a bias that reads
the window's length. tests/test_check.py holds `posenc check` to catching it (the prefix row),
tests/test_leaderboard.py holds `posenc leaderboard` to refusing it. Module text, written into a
plug-in directory by each test."""

IMPORTS = """import torch
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
