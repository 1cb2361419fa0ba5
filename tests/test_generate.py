"""`posenc generate RUN_DIR` on a tiny trained run: the text is the run's own continuation (greedy: the
argmax of the full forward at every step), the same seed gives the same text, the training length is
said once when crossed, and a prompt the encoding cannot encode is refused in one line with nothing
generated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY, run_cli, run_dirs

from posenc.eval.generation import TextStream
from posenc.eval.run import load_trained

PROMPT = "def main(args):\n    "


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """4-step TINY runs (T = 32) of RoPE and of learned absolute positions (max_len 32)."""
    out = {}
    for encoding in ("rope", "learned"):
        cwd = tmp_path_factory.mktemp(encoding)
        result = run_cli("train", *TINY, f"encoding={encoding}", cwd=cwd)
        assert result.returncode == 0, result.stderr[-2000:]
        [out[encoding]] = run_dirs(cwd)
    return out


def generate(run_dir: Path, *args: str):
    return run_cli("generate", str(run_dir), *args, cwd=run_dir.parent)


def test_greedy_text_is_the_runs_own_continuation_and_says_when_it_passes_the_training_length(runs):
    """--temperature 0 continues with the argmax of the model's full forward over everything so far, at
    every step (the cache computes what the model computes), 20 tokens past T = 32, said once."""
    result = generate(runs["rope"], "--prompt", PROMPT, "--max-new-tokens", "40", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    _, data, model, _, _, _ = load_trained(runs["rope"], [])
    ids = list(PROMPT.encode())
    with torch.no_grad():
        for _ in range(40):
            ids.append(int(model.eval()(torch.tensor([ids]))[0][0, -1].argmax()))
    assert result.stdout == bytes(ids).decode("utf-8", errors="replace") + "\n"
    assert result.stderr.count("past the training length (32 tokens)") == 1
    assert "tokens/s" in result.stderr and "keys at their positions" in result.stderr


def test_the_same_seed_gives_the_same_text(runs):
    first, again, other = (generate(runs["rope"], "--prompt", PROMPT, "--max-new-tokens", "30", "--seed", seed)
                           for seed in ("3", "3", "4"))
    assert first.returncode == 0 and first.stdout == again.stdout != other.stdout
    assert first.stdout.startswith(PROMPT) and len(first.stdout) > len(PROMPT)


def test_a_prompt_past_max_len_is_refused_in_one_line_and_nothing_is_generated(runs):
    too_long = generate(runs["learned"], "--prompt", "x" * 33, "--max-new-tokens", "1")
    assert too_long.returncode == 1 and too_long.stdout == ""
    assert too_long.stderr.strip().count("\n") == 0 and "max_len=32" in too_long.stderr
    reaching = generate(runs["learned"], "--prompt", "x" * 20, "--max-new-tokens", "20")
    assert reaching.returncode == 1 and reaching.stdout == "" and "--max-new-tokens 13 or fewer" in reaching.stderr
    fits = generate(runs["learned"], "--prompt", "x" * 20, "--max-new-tokens", "13")
    assert fits.returncode == 0, fits.stderr


def test_a_missing_or_doubled_prompt_is_one_error_line(runs, tmp_path):
    for args in ([], ["--prompt", "a", "--prompt-file", str(tmp_path / "p.txt")], ["--prompt-file", str(tmp_path / "no")]):
        result = generate(runs["rope"], *args)
        assert result.returncode == 1 and result.stderr.startswith("error:") and result.stderr.strip().count("\n") == 0


def test_the_stream_holds_back_a_character_split_across_tokens():
    stream = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    pieces = [stream.push(b) for b in "é!".encode()]  # é is two bytes
    assert pieces == ["", "é", "!"] and stream.flush() == ""
