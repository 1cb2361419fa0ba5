"""Synthetic tasks with a length split: train at length L, evaluate at 1×, 2×, 4×, 8× L.

Byte-level (vocab 256, posenc's default tokenizer), so every task runs on the existing model.
An instance is ``ids`` of exactly L+1 tokens (x = ids[:-1], y = ids[1:]) and an ``answer_mask``
of L booleans: position t is scored iff y[t] is part of the answer. Each generator builds the
answer from the instance it writes, so answers are correct by construction.

- passkey (Mohtashami & Jaggi, 2023): a 5-digit key hidden at a random depth in the paper's
  filler text ("The grass is green. ..."); the sequence ends with the query marker and the key.
- copy (Jelassi et al., 2024, "Repeat After Me"): a random string over 26 letters, a separator,
  then the string again; the string is half the length, so it grows with L.
- mqar (Arora et al., 2023, "Zoology"): multi-query associative recall: L/8 key-value pairs,
  then every key asked once at random places in a blank region; the answer is its value.
- selective_copy (Gu & Dao, 2023; the CoPE paper's task, Golovneva et al., 2024): 16 letters
  scattered among blanks, a separator, then the letters in order (skipping the blanks).
- flip_flop (Liu et al., 2023): pairs "w b" (write bit b), "i b" (ignore), "r b" (read): the bit
  after each read is the last written bit. FFL(p_ignore=0.8) with p_write = p_read = 0.1.

Instances come from numpy Generators seeded through ``SeedSequence``: the evaluation set of a
(task, length, seed) is one fixed entropy tuple tagged "eval", training batches draw their own
tuples tagged "train", so training and evaluation never share a random stream.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from posenc.data.batches import IGNORE_INDEX, Batch

if TYPE_CHECKING:
    import datasets

TASKS = ("passkey", "copy", "mqar", "selective_copy", "flip_flop")
#: how training targets are built: only the answer (the papers' protocol) or every next token
TARGETS = ("answer", "all")
#: how evaluation scores an answer: the argmax at each answer position given the instance's own tokens
#: (teacher forcing), or generated greedily with the model's cache, its own answer tokens fed back
SCORINGS = ("teacher_forced", "generated")
#: independent random streams: training batches, validation during training, the final evaluation
_SPLIT_TAG = {"train": 1, "eval": 2, "validation": 3}
VOCAB_SIZE = 256  # byte values: the tasks need no tokenizer

# byte values (vocab 256): readable ASCII, so a generated instance prints as text
PAD = ord(" ")
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8).astype(np.int64)
DIGITS = np.frombuffer(b"0123456789", dtype=np.uint8).astype(np.int64)
# Mohtashami & Jaggi's filler; it contains no digit and no '=', so the key is unambiguous
PASSKEY_FILLER = np.frombuffer(
    b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ",
    dtype=np.uint8).astype(np.int64)
KEY_MARK, SEP, BLANK = ord("="), ord("|"), ord(".")
WRITE, IGNORE, READ, ZERO, ONE = ord("w"), ord("i"), ord("r"), ord("0"), ord("1")
MQAR_KEYS = np.arange(128, 256, dtype=np.int64)  # 128 keys (non-ASCII bytes), values are letters


def _passkey(rng: np.random.Generator, length: int, digits: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """[filler | '=' key | filler] '=' key: the key's digits are the answer at the end."""
    n = length + 1
    key = rng.choice(DIGITS, digits)
    need = 2 * (digits + 1)
    if n < need:
        raise ValueError(f"passkey with {digits} digits needs length >= {need - 1}, got {length}")
    start = int(rng.integers(len(PASSKEY_FILLER)))  # a random phase of the filler text
    ids = np.resize(np.roll(PASSKEY_FILLER, -start), n - (digits + 1))
    depth = int(rng.integers(0, len(ids) - digits))  # where the key hides (0 = the very start)
    ids[depth] = KEY_MARK
    ids[depth + 1 : depth + 1 + digits] = key
    ids = np.concatenate([ids, [KEY_MARK], key])
    mask = np.zeros(length, dtype=bool)
    mask[length - digits :] = True  # y[t] = ids[t+1]: the query mark predicts the first digit
    return ids, mask


def _copy(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray]:
    """s '|' s [pad]: s of (L+1-1)//2 random letters; the second s is the answer."""
    n = length + 1
    m = (n - 1) // 2
    if m < 1:
        raise ValueError(f"copy needs length >= 2, got {length}")
    s = rng.choice(LETTERS, m)
    ids = np.full(n, PAD, dtype=np.int64)
    ids[:m], ids[m], ids[m + 1 : 2 * m + 1] = s, SEP, s
    mask = np.zeros(length, dtype=bool)
    mask[m : 2 * m] = True  # predicting ids[m+1 .. 2m]
    return ids, mask


def _mqar(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray]:
    """k1 v1 .. kD vD, then each key once, at random places among blanks, followed by its value."""
    n = length + 1
    pairs = min(max(n // 8, 1), len(MQAR_KEYS))
    if n < 4 * pairs:
        raise ValueError(f"mqar needs length >= 3, got {length}")
    keys = rng.choice(MQAR_KEYS, pairs, replace=False)
    values = rng.choice(LETTERS, pairs)
    ids = np.full(n, BLANK, dtype=np.int64)
    ids[0 : 2 * pairs : 2], ids[1 : 2 * pairs : 2] = keys, values
    # query slots: `pairs` non-overlapping (key, value) slots in the region after the pairs,
    # spread at random (choose slot starts among free cells, shifted so they never touch)
    region = n - 2 * pairs
    gaps = np.sort(rng.choice(region - 2 * pairs + 1, pairs, replace=False)) if region > 2 * pairs \
        else np.zeros(pairs, dtype=np.int64)
    starts = 2 * pairs + gaps + 2 * np.arange(pairs)
    order = rng.permutation(pairs)
    ids[starts], ids[starts + 1] = keys[order], values[order]
    mask = np.zeros(length, dtype=bool)
    mask[starts] = True  # the query key predicts its value
    return ids, mask


def _selective_copy(rng: np.random.Generator, length: int, tokens: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """[letters scattered among blanks] '|' letters in order."""
    n = length + 1
    region = n - 1 - tokens
    if region < tokens:
        raise ValueError(f"selective_copy with {tokens} tokens needs length >= {3 * tokens}, got {length}")
    s = rng.choice(LETTERS, tokens)
    ids = np.full(n, BLANK, dtype=np.int64)
    ids[np.sort(rng.choice(region, tokens, replace=False))] = s
    ids[region], ids[region + 1 :] = SEP, s
    mask = np.zeros(length, dtype=bool)
    mask[region:] = True
    return ids, mask


def _flip_flop(rng: np.random.Generator, length: int, p_ignore: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """(instruction, bit) pairs starting with a write; after 'r' comes the last written bit."""
    n = length + 1
    pairs = n // 2
    if pairs < 2:
        raise ValueError(f"flip_flop needs length >= 3, got {length}")
    p_rw = (1 - p_ignore) / 2
    ops = rng.choice(np.array([WRITE, IGNORE, READ]), pairs, p=[p_rw, p_ignore, p_rw])
    ops[0] = WRITE  # the first instruction writes, so every read has an answer
    if not (ops == READ).any():
        ops[-1] = READ  # every instance asks at least once
    bits = rng.choice(np.array([ZERO, ONE]), pairs)
    written = np.where(ops == WRITE, bits, 0)
    last = np.maximum.accumulate(np.where(ops == WRITE, np.arange(pairs), 0))  # index of last write
    bits = np.where(ops == READ, written[last], bits)
    ids = np.full(n, PAD, dtype=np.int64)
    ids[0 : 2 * pairs : 2], ids[1 : 2 * pairs : 2] = ops, bits
    mask = np.zeros(length, dtype=bool)
    mask[0 : 2 * pairs : 2] = ops == READ  # the 'r' token predicts the bit after it
    return ids, mask


GENERATORS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "passkey": _passkey, "copy": _copy, "mqar": _mqar, "selective_copy": _selective_copy,
    "flip_flop": _flip_flop,
}


def check_task(name: str) -> None:
    if name not in GENERATORS:
        raise ValueError(f"dataset.task must be one of {', '.join(TASKS)}, got '{name}'")


def generate(name: str, length: int, n: int, rng: np.random.Generator, **options) -> tuple[np.ndarray, np.ndarray]:
    """n instances: ids (n, length+1) int64 and answer_mask (n, length) bool."""
    check_task(name)
    rows = [GENERATORS[name](rng, length, **options) for _ in range(n)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def eval_rng(name: str, length: int, seed: int, split: str = "eval") -> np.random.Generator:
    """The evaluation (or validation) stream of (task, length, seed): the same on every machine and run."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), length, _SPLIT_TAG[split]])


def make_task(name: str, length: int, n: int, seed: int, split: str = "eval", **options) -> datasets.Dataset:
    """The evaluation set of a task at one length: columns ids (length+1 ints) and answer_mask
    (length bools); the same seed gives the same instances. ``split='validation'`` draws the
    held-out instances training validates on, disjoint in stream from the final evaluation's."""
    ids, mask = generate(name, length, n, eval_rng(name, length, seed, split), **options)
    import datasets  # ~1.5 s to import: only where a task set is built, not for every command

    return datasets.Dataset.from_dict({"ids": ids.tolist(), "answer_mask": mask.tolist()})


def targets_of(ids: Tensor, mask: Tensor, targets: str = "answer") -> tuple[Tensor, Tensor]:
    """(x, y) from ids (B, L+1) and answer_mask (B, L): y = IGNORE_INDEX off the answer when
    targets='answer', every next token when targets='all'."""
    x, y = ids[:, :-1], ids[:, 1:]
    if targets == "answer":
        y = y.masked_fill(~mask, IGNORE_INDEX)
    return x, y


class TaskBatches:
    """Training batches of one task at one length: Batch of (x, y) int64 (B, L) tensors on CPU.

    y is the answer only (IGNORE_INDEX elsewhere) by default: the papers score and train the
    answer, and the filler of passkey or the random strings of copy are noise a loss on every
    token would spend the model on. ``targets='all'`` makes every next token a target.
    Each batch is generated from one draw of a seeded torch.Generator, whose state saves and
    restores, so a resumed run draws the same batches (as posenc.data.windows.RandomWindows).
    """

    def __init__(self, task: str, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, targets: str = "answer", **options) -> None:
        check_task(task)
        if targets not in TARGETS:
            raise ValueError(f"dataset.targets must be one of {', '.join(TARGETS)}, got '{targets}'")
        generate(task, seq_len, 1, np.random.default_rng(0), **options)  # refuse a bad length now
        self.task, self.seq_len, self.batch_size = task, seq_len, batch_size
        self.rank, self.world_size = rank, world_size
        self.targets, self.options = targets, options
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> Batch:
        draw = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        rng = np.random.default_rng([draw, _SPLIT_TAG["train"]])
        # every rank generates the global batch and keeps its own shard: same data as one process
        ids, mask = generate(self.task, self.seq_len, self.batch_size * self.world_size, rng, **self.options)
        shard = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        return Batch(*targets_of(torch.from_numpy(ids[shard]), torch.from_numpy(mask[shard]), self.targets))

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


@dataclass
class SyntheticTask:
    """``dataset=synthetic``: the task a run trains and is evaluated on (conf/dataset/synthetic.yaml).

    Training draws ``batches(...)`` at trainer.seq_len; evaluation scores ``eval_instances``
    instances at each of ``eval_multiples`` × trainer.seq_len (posenc.eval.tasks.evaluate_task),
    rounded to whole tokens. A multiple may be a fraction: a run fine-tuned at 4T from a parent
    trained at T scores 0.25, 0.5, 1, 2, 4 × 4T = 1, 2, 4, 8, 16 × T, the parent's lengths.
    ``options`` go to the task's generator (passkey: digits; selective_copy: tokens;
    flip_flop: p_ignore). ``scoring``: teacher_forced, or generated (posenc/eval/tasks.py: the model
    produces each answer with its cache, as a user decoding it would).
    """

    task: str = "passkey"
    name: str = "synthetic"
    targets: str = "answer"
    scoring: str = "teacher_forced"
    eval_multiples: list[float] = field(default_factory=lambda: [1, 2, 4, 8])
    eval_instances: int = 256
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_task(self.task)
        if self.targets not in TARGETS:
            raise ValueError(f"dataset.targets must be one of {', '.join(TARGETS)}, got '{self.targets}'")
        if self.scoring not in SCORINGS:
            raise ValueError(f"dataset.scoring must be one of {', '.join(SCORINGS)}, got '{self.scoring}'")
        if self.eval_instances < 1 or not self.eval_multiples or min(self.eval_multiples) <= 0:
            raise ValueError("dataset.eval_instances and every dataset.eval_multiples must be positive")
        # whole multiples stay ints (1, not 1.0: what summary.json and the logs have always shown)
        self.eval_multiples = [int(m) if float(m).is_integer() else float(m) for m in self.eval_multiples]
        self.options = dict(self.options)  # Hydra hands a DictConfig

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def batches(self, seq_len: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> TaskBatches:
        return TaskBatches(self.task, seq_len, batch_size, seed, rank, world_size, self.targets, **self.options)

    def validation_batches(self, length: int, n: int, batch_size: int) -> Iterator[tuple[Batch, int]]:
        """Training's periodic validation: n held-out instances at ``length`` (the 'validation'
        stream, never the final evaluation's), with the targets training uses (spec.targets)."""
        ds = make_task(self.task, length, n, 0, split="validation", **self.options).with_format("torch")
        for start in range(0, n, max(1, batch_size)):
            rows = ds[start : start + max(1, batch_size)]
            yield Batch(*targets_of(rows["ids"], rows["answer_mask"], self.targets)), 0

    def bytes_per_token(self, split: str = "validation") -> None:
        """Task instances are not text: no bits per byte."""
        return None
