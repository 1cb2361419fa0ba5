"""How long a `posenc bench` will take, said before it takes it, and the quick preset on a CPU.

Every model's cost is counted in training steps from the plan: its warm-up, its timed rounds and,
for each of its rounds, one round of every baseline already built (run.py pairs them), plus one
step for its memory. Once the first rows are measured (the two baselines, together) the last
one's median step time turns the remaining steps into seconds, assuming every model's step costs
about as much (an encoding with a bias costs more, so this is a lower bound on a quiet machine,
and a busy one stretches it). The full bench (bench=default: every encoding, 3 rounds of 10 steps)
and the quick one (bench=quick: a representative few encodings, 2 rounds of 3 steps; the CPU
default, a first look in under 3 minutes on 2 cores) are both estimated, so a user sees what the
other choice would cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from posenc.bench.plan import order_of
from posenc.config import compose, group_options, parse_overrides
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


def preset(cfg: DictConfig, names: Sequence[str] | None = None) -> dict:
    """A preset's timing and the models it measures (names: the encodings the user chose, else
    the preset's own list, else every encoding)."""
    b = cfg.bench
    names = list(names) if names else list(b.encodings) if b.encodings else group_options("encoding")
    return {**{k: int(b[k]) for k in ("warmup", "steps", "rounds")}, "order": order_of(names, bool(b.reference))}


def duration(baselines: Sequence[str], done: int, step_s: float, b: dict) -> float:
    """Seconds left for the preset's models after the first ``done``, at step_s a step."""
    return sum(model_steps(b["order"], baselines, b["warmup"], b["steps"], b["rounds"])[done:]) * step_s


def clock(seconds: float) -> str:
    """'about 12 min', 'about 1 h 05 min', 'under a minute'."""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    return f"about {minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"about {minutes} min"


def estimate_line(baselines: Sequence[str], done: int, step_s: float, chosen: str, presets: dict[str, dict]) -> str:
    """'estimate: about 2 min left (bench=quick, 5 more models at ~0.60 s/step, nope's pace);
    the full bench (bench=default, 22 models): about 1 h 05 min'."""
    left = duration(baselines, done, step_s, presets[chosen])
    other = FULL if chosen == QUICK else QUICK
    alternative = duration(baselines, 0, step_s, presets[other])
    more = len(presets[chosen]["order"]) - done
    line = (f"estimate: {clock(left)} left (bench={chosen}, {more} more model{'' if more == 1 else 's'} at "
            f"~{step_s:.2f} s/step, the last row's pace; encodings with a bias take longer)")
    if other == QUICK and alternative >= left:  # starting over would not be quicker: the user's own
        return line                             # bench.steps/rounds/warmup are the quick preset's too
    what = "the full bench" if other == FULL else "a first look"
    return f"{line}; {what} (bench={other}, {len(presets[other]['order'])} models): {clock(alternative)}"


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


def presets_of(overrides: list[str], names: Sequence[str] | None = None) -> dict[str, dict]:
    """The warm-up, steps, rounds and models of both presets under these overrides (a bench.steps=…
    override changes both; names, the encodings the user chose, are both presets' models)."""
    return {name: preset(compose([f"bench={name}", *_shared(overrides)]), names) for name in (QUICK, FULL)}
