"""How long a `posenc bench` will take, said before it takes it, and the quick preset on a CPU.

Every model's cost is counted in training steps from the plan: its warm-up, its timed rounds and,
for each of its rounds, one round of every baseline already built (run.py pairs them), plus one
step for its memory. After the first model is measured its median step time turns the remaining
steps into seconds, assuming every model's step costs about as much as the first one's (an
encoding with a bias costs more, so this is a lower bound on a quiet machine, and a busy one
stretches it). The full bench (bench=default) and the quick one (bench=quick) are both
estimated, so a user sees what the other choice would cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from posenc.config import compose, parse_overrides
from posenc.hardware import resolve_device

QUICK, FULL = "quick", "default"  # conf/bench/quick.yaml, conf/bench/default.yaml


def model_steps(order: Sequence[str], baselines: Sequence[str], warmup: int, steps: int, rounds: int) -> list[int]:
    """Training steps each model of ``order`` costs: warm-up, its rounds, a round of each baseline
    built before it after each of its rounds, and one step for its memory."""
    out, built = [], 0
    for name in order:
        out.append(warmup + rounds * steps * (1 + built) + 1)
        built += name in baselines
    return out


def preset(cfg: DictConfig) -> dict[str, int]:
    return {k: int(cfg.bench[k]) for k in ("warmup", "steps", "rounds")}


def duration(order: Sequence[str], baselines: Sequence[str], done: int, step_s: float, b: dict[str, int]) -> float:
    """Seconds left for the models of ``order`` after the first ``done``, at step_s a step."""
    return sum(model_steps(order, baselines, b["warmup"], b["steps"], b["rounds"])[done:]) * step_s


def clock(seconds: float) -> str:
    """'about 12 min', 'about 1 h 05 min', 'under a minute'."""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    return f"about {minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"about {minutes} min"


def estimate_line(order: Sequence[str], baselines: Sequence[str], done: int, step_s: float, chosen: str,
                  presets: dict[str, dict[str, int]]) -> str:
    """'estimate: about 9 min left (bench=quick, 18 models at ~1.20 s/step, the first model's pace);
    the full bench (bench=default): about 1 h 05 min'."""
    left = duration(order, baselines, done, step_s, presets[chosen])
    other = FULL if chosen == QUICK else QUICK
    alternative = duration(order, baselines, 0, step_s, presets[other])
    line = (f"estimate: {clock(left)} left (bench={chosen}, {len(order) - done} more models at ~{step_s:.2f} s/step, "
            f"the first model's pace; encodings with a bias take longer)")
    if other == QUICK and alternative >= left:  # starting over would not be quicker: the user's own
        return line                             # bench.steps/rounds/warmup are the quick preset's too
    what = "the full bench" if other == FULL else "a first look"
    return f"{line}; {what} (bench={other}): {clock(alternative)}"


def choose_preset(overrides: list[str]) -> tuple[list[str], str]:
    """(overrides, the bench preset they run): a `bench=` choice or a timing override
    (bench.steps, bench.rounds, bench.warmup) as given; otherwise bench=quick where the device is a
    CPU (the full bench of every encoding takes an hour or more there), bench=default elsewhere."""
    parsed = parse_overrides(overrides)
    given = next((value for key, value, _ in parsed if key == "bench"), None)
    if given is not None:
        return overrides, str(given)
    if any(key in ("bench.steps", "bench.rounds", "bench.warmup") for key, _, _ in parsed):
        return overrides, FULL
    device = resolve_device(compose(_shared(overrides)).device)
    return ([f"bench={QUICK}", *overrides], QUICK) if device.type == "cpu" else (overrides, FULL)


def _shared(overrides: list[str]) -> list[str]:
    """The overrides every model shares: no encoding choice or option, no bench preset."""
    return [o.input_line for key, _, o in parse_overrides(overrides)
            if not key.startswith("encoding") and key != "bench"]


def presets_of(overrides: list[str]) -> dict[str, dict[str, int]]:
    """The warm-up, steps and rounds of both presets under these overrides (a bench.steps=…
    override changes both)."""
    return {name: preset(compose([f"bench={name}", *_shared(overrides)])) for name in (QUICK, FULL)}
