"""What `posenc bench` measures: which encodings, each one's config, the shape.

``bench.encodings=[nope,rope]`` (or ``encoding=nope,rope``) picks the encodings, ``encoding=all``
every one (the preset's list otherwise: bench=quick's representative few, bench=default's all);
every other override applies to all of them, and an ``encoding.KEY=V`` override to those that have KEY.
"""

from __future__ import annotations

from omegaconf import DictConfig

from posenc.bench.reference import REFERENCE
from posenc.config import compose, group_options, parse_overrides
from posenc.errors import UserError

BASELINES = (REFERENCE, "nope")  # measured first: every later row has its ratios when it appears
ALL = "all"  # encoding=all: every encoding, whatever the preset lists


def select_encodings(overrides: list[str]) -> tuple[list[str], list[str], DictConfig]:
    """(encoding names, the other overrides, the config without encoding options) of argv.
    ``encoding=a,b`` selects, as ``bench.encodings=[a,b]`` does; ``encoding=all`` every encoding."""
    parsed = parse_overrides(overrides)
    chosen = [value if isinstance(value, list) else [value] for key, value, _ in parsed if key == "encoding"]
    overrides = [o.input_line for key, _, o in parsed if key != "encoding"]
    cfg = compose([o.input_line for key, _, o in parsed if key != "encoding" and not key.startswith("encoding.")])
    b = cfg.bench
    known = group_options("encoding")
    if chosen and chosen[-1] == [ALL]:
        chosen = [known]
    names = chosen[-1] if chosen else list(b.encodings) if b.encodings else known
    for name in names:
        if name not in known:
            raise UserError(f"unknown encoding '{name}' in bench.encodings — choose from {', '.join(known)}")
    return names, overrides, cfg


def chose_encodings(overrides: list[str]) -> bool:
    """Whether argv picks the encodings (``encoding=…``, ``bench.encodings=…``) rather than the preset."""
    return any(key in ("encoding", "bench.encodings") for key, _, _ in parse_overrides(overrides))


def order_of(names: list[str], reference: bool) -> list[str]:
    """The order models are measured in: the baselines first (they stay built, and every later
    model's rounds alternate with theirs), then the encodings as listed."""
    order = [n for n in BASELINES if n in names or (n == REFERENCE and reference)]
    return order + [n for n in names if n not in order]


def encoding_config(overrides: list[str], name: str) -> DictConfig:
    """The config for one encoding of the list. An ``encoding.KEY=V`` override applies to the
    encodings that have KEY (``encoding.base=500`` changes rope, not nope)."""
    parsed = parse_overrides(overrides)
    own = [o.input_line for key, _, o in parsed if not key.startswith("encoding.")]
    cfg = compose([*own, f"encoding={name}"])
    keys = [o.input_line for key, _, o in parsed if key.startswith("encoding.") and key.split(".", 1)[1] in cfg.encoding]
    return compose([*own, f"encoding={name}", *keys]) if keys else cfg


def check_encoding_overrides(overrides: list[str], names: list[str]) -> None:
    """An ``encoding.KEY`` that no encoding in the list has is a typo: say so."""
    for key, _, _ in parse_overrides(overrides):
        if key.startswith("encoding.") and not any(
            key.split(".", 1)[1] in compose([f"encoding={n}"]).encoding for n in names
        ):
            raise UserError(f"no encoding in bench.encodings={names} has the option '{key}' — "
                            f"see `posenc encodings` for each one's options")


def validate(b: DictConfig) -> None:
    for key in ("steps", "rounds", "batch_size", "seq_len"):
        if b[key] <= 0:
            raise UserError(f"bench.{key} must be positive, got {b[key]}")
    if b.warmup < 0 or b.eval_length_multiple < 0:
        raise UserError("bench.warmup and bench.eval_length_multiple must be >= 0")
    if b.decode and (b.decode_steps <= 0 or not b.decode_contexts or
                     min(b.decode_contexts) * b.seq_len <= b.decode_steps):
        raise UserError(f"bench.decode_steps must be positive and below every context decoded at (bench.decode_contexts "
                        f"× bench.seq_len, the last bench.decode_steps tokens of it decoded), got {b.decode_steps} and "
                        f"{[c * b.seq_len for c in b.decode_contexts]}")
