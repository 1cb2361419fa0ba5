"""What `posenc check` checks: the encoding a config describes, inside a tiny model.

The config is composed as every command composes it (posenc.config.compose, with the user's
overrides and any ``--config-dir``), on a shape small enough for seconds on a CPU: d_model 32,
4 heads, 2 layers — placed before the user's overrides, so ``model.n_layer=3`` or a ``layout=``
still applies — and a window of T = 24 tokens (``SEQ_LEN``; the run's own where shorter:
``check_length``). The model is built by posenc.build, as training builds it.

Two things of the run are kept beside the window (``Subject.of``): the positions its evaluation
reaches, max(eval.lengths) × trainer.seq_len (``longest``: 16 × 256 = 4096 by default; rounded up to
a power of 2, at least 4096: ``measured_positions``), and the
precision it trains in (``precision``: trainer.precision, ``auto`` resolved as training resolves it),
which the precision rows measure in (posenc/check/precision.py).

An encoding may behave otherwise in training (``self.training``: random positions drawn in each
forward, Ruoss et al., 2023), so every property that can differ between the modes is measured in
both (``MODES``): ``model.eval()`` and ``model.train()`` with dropout off, so that both compute one
function of their inputs. Two forwards that are compared draw the same random numbers
(``seeded``): a property compares what the model computes, not two draws of its randomness.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from posenc.build import build_model
from posenc.config import compose, validate
from posenc.hardware import resolve_precision
from posenc.nn.model import GPT

#: the window the checks measure in (the run's own where shorter: ``check_length``)
SEQ_LEN = 24
#: the tiny shape, before the user's overrides
SHAPE = ["model.d_model=32", "model.n_head=4", "model.n_layer=2", "model.dropout=0.0"]
#: the fewest positions the precision rows reach (``measured_positions``): the default config's evaluation's
MIN_POSITIONS = 16 * 256
#: the vocabulary of the random tokens the checks feed the model
VOCAB = 64
#: three documents in the first row (7 + 10 + 7 tokens), two in the second (15 + 9)
DOCS = ((7, 10, 7), (15, 9))
#: the modes a property that can differ between them is measured in, and how notes name them
MODES = ("eval", "train")
MODE_NAMES = {"eval": "evaluation (model.eval())", "train": "training (model.train())"}
#: the seed every compared forward draws its random numbers from (``seeded``)
FORWARD_SEED = 1234


@contextlib.contextmanager
def seeded(seed: int = FORWARD_SEED) -> Iterator[None]:
    """torch's CPU generator at seed for the duration, and as it was afterwards: two forwards
    compared under it draw the same random numbers (an encoding's random positions in training)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def forward(model: GPT, x: torch.Tensor, **kwargs) -> torch.Tensor:
    """model(x, **kwargs)'s logits, without gradients, its randomness drawn from FORWARD_SEED."""
    with torch.no_grad(), seeded():
        return model(x, **kwargs)[0]


def compose_subject(overrides: list[str]) -> Subject:
    """The user's overrides (Hydra syntax, ``hydra.searchpath=[...]`` included) on the tiny shape."""
    cfg = compose([*SHAPE, *overrides], bench=False)
    validate(cfg)
    return Subject.of(cfg)


def check_length(cfg: DictConfig) -> int:
    """The window the check measures in: SEQ_LEN, or the run's length when shorter. A run's encoding
    may encode no more positions than it trains on (``encoding=learned encoding.max_len=16
    trainer.seq_len=16``); measured at the check's length it would raise in every row and fail a
    contract it keeps."""
    return min(SEQ_LEN, int(cfg.trainer.seq_len))


def longest_position(cfg: DictConfig) -> int:
    """How many positions the run's evaluation reaches: max(eval.lengths) × trainer.seq_len (at
    least the run's own length)."""
    lengths = [float(x) for x in (OmegaConf.select(cfg, "eval.lengths", default=None) or [1])]
    return max(int(max(lengths) * int(cfg.trainer.seq_len)), int(cfg.trainer.seq_len))


def measured_positions(cfg: DictConfig) -> int:
    """The positions the precision rows reach: the run's evaluation's (``longest_position``), rounded
    up to a power of 2 and at least MIN_POSITIONS — so that the verdicts measured for the default
    config (16 × 256 = 4096) are those of every run whose evaluation reaches no further."""
    return max(MIN_POSITIONS, 1 << (longest_position(cfg) - 1).bit_length())


def training_precision(cfg: DictConfig) -> str:
    """The precision the run trains in: trainer.precision, ``auto`` resolved as posenc/hardware.py
    resolves it on the run's device (bf16 on CUDA, fp32 on a CPU)."""
    spec = str(OmegaConf.select(cfg, "trainer.precision", default="auto"))
    if spec != "auto":
        return resolve_precision(spec, torch.device("cpu"))  # an unknown name: its one error line
    device = str(OmegaConf.select(cfg, "device", default="auto"))
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if on_cuda and not torch.cuda.is_available():  # a CUDA run's config read on a CPU machine
        return "bf16"
    return resolve_precision(spec, torch.device("cuda" if on_cuda else "cpu"))


@dataclass
class Subject:
    """The config under check and what every property builds from it: cfg on the check's window;
    longest: the positions the precision rows reach (``measured_positions``); precision: the run's training precision
    (fp32 | bf16 | fp16)."""

    cfg: DictConfig
    longest: int = MIN_POSITIONS
    precision: str = "fp32"

    @classmethod
    def of(cls, run: DictConfig) -> Subject:
        """The subject of a run's config: on the check's window (``check_length``), the positions its
        evaluation reaches and its precision kept from the run's own config."""
        cfg = copy.deepcopy(run)
        OmegaConf.set_readonly(cfg, False)
        OmegaConf.update(cfg, "trainer.seq_len", check_length(run), merge=False)
        return cls(cfg, measured_positions(run), training_precision(run))

    @property
    def T(self) -> int:
        return int(self.cfg.trainer.seq_len)

    @property
    def softmax(self) -> bool:
        """Whether the model forms scores (documents and windows need a mask to act on)."""
        return self.cfg.model.attention == "softmax"

    def model(self, *, seed: int = 0, dtype: torch.dtype = torch.float64, visible: bool = True,
              cfg: DictConfig | None = None, mode: str = "eval") -> GPT:
        """The model, in mode (MODES: ``eval``, or ``train`` with dropout off). visible: every
        encoding parameter moved by N(0, 0.5²) from its initialisation, so that a table that starts
        at zero (T5's, CoPE's) takes part in what is compared; the learning check uses the
        initialisation itself (visible=False)."""
        cfg = cfg if cfg is not None else self.cfg
        if mode == "train" and cfg.model.dropout:
            cfg = copy.deepcopy(cfg)
            cfg.model.dropout = 0.0  # dropout is randomness of its own: the modes compute one function
        torch.manual_seed(seed)
        model = build_model(cfg, vocab_size=VOCAB).to(dtype).train(mode == "train")
        if visible:
            g = torch.Generator().manual_seed(seed + 1)
            with torch.no_grad():
                for p in model.encoding.parameters():
                    p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        return model

    def with_changes(self, **keys: object) -> DictConfig:
        """A copy of the config with keys ('layout.window': 4) set."""
        cfg = copy.deepcopy(self.cfg)
        for key, value in keys.items():
            OmegaConf.update(cfg, key, value, merge=False)
        return cfg

    def tokens(self, seed: int = 0, batch: int = 2, T: int | None = None) -> torch.Tensor:
        """(batch, T) random token ids."""
        return torch.randint(VOCAB, (batch, T or self.T), generator=torch.Generator().manual_seed(seed))

    def documents(self) -> torch.Tensor:
        """(2, T) document ids of DOCS, cut or padded to T with the last document."""
        rows = [sum(([d] * n for d, n in enumerate(lengths)), []) for lengths in DOCS]
        return torch.tensor([(row + [row[-1]] * self.T)[: self.T] for row in rows])
