"""Small things a user meets: a piped `posenc encodings` is not cut, `posenc eval` file names,
numbers shown as typed, a tiny text's validation split, and a test suite that keeps out of
the user's ~/.cache."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from conftest import TEST_CACHE, TINY, cli_env, run_cli, run_dirs
from posenc.cli.catalogue import yaml_value
from posenc.config import encoding_catalogue
from posenc.data.corpora import TextFiles
from posenc.data.packing import cache_root
from posenc.eval.run import output_name
from posenc.rundir import plain_number


def test_a_piped_encodings_list_shows_every_option_whole(tmp_path: Path):
    env = cli_env()
    env.pop("COLUMNS")  # a pipe with no COLUMNS: rich's 80 columns
    result = run_cli("encodings", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    for name, _, options in encoding_catalogue():
        for key, value in options.items():
            assert f"{key}={yaml_value(value)}" in result.stdout, (name, key)
    assert "original_max_len=${trainer.seq_len}" in result.stdout
    assert "base=10000 " in result.stdout and "1e4" not in result.stdout


def test_eval_file_names_say_what_changed_without_equals_signs_or_eval_eval():
    assert output_name([]) == "eval.json"
    assert output_name(["eval.lengths=[1,2,4,8,16]"]) == "eval_lengths-1-2-4-8-16.json"
    assert output_name(["encoding.scaling=yarn", "encoding.scaling_factor=4"]) == \
        "eval_scaling-yarn_scaling_factor-4.json"
    assert output_name(["encoding.base=1e4"]) == "eval_base-10000.json"
    for overrides in (["eval.stride=64", "device=cpu"], ["+eval.extra=a/b"]):
        name = output_name(overrides)
        assert "=" not in name and "/" not in name and not name.startswith("eval_eval")


def test_numbers_are_shown_as_typed():
    assert plain_number(10000.0) == "10000" and plain_number(10000) == "10000"
    assert plain_number(0.5) == "0.5" and plain_number("rope") == "rope"


def test_a_text_too_small_for_its_validation_fraction_says_what_the_split_became(tmp_path: Path, caplog, monkeypatch):
    # a relative path: the documents' sources ("tiny.txt:0".."tiny.txt:2") and so their hashes,
    # none of which falls in the 5% validation band, do not depend on the temporary directory
    monkeypatch.chdir(tmp_path)
    Path("tiny.txt").write_text("".join(f"line {i}\n" for i in range(450)))  # 3 documents of 200 lines
    corpus = TextFiles(["tiny.txt"], val_fraction=0.05)
    with caplog.at_level(logging.WARNING, logger="posenc"):
        splits = corpus.split(corpus.documents())
    assert len(splits["validation"]) == 1
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "\n" not in message
    assert "only 3 documents" in message and "val_fraction=0.05" in message and "last 1 document(s)" in message


def test_the_suite_keeps_out_of_the_users_cache(tmp_path: Path, monkeypatch):
    home_cache = Path.home() / ".cache"
    for var in ("POSENC_CACHE", "HF_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "WANDB_CACHE_DIR"):
        assert Path(os.environ[var]).is_relative_to(TEST_CACHE) and not Path(os.environ[var]).is_relative_to(home_cache)
    # posenc's own cache follows XDG_CACHE_HOME when POSENC_CACHE is not set
    monkeypatch.delenv("POSENC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "posenc"

    # a whole run, W&B included, with a fresh HOME: nothing lands in HOME/.cache
    home = tmp_path / "home"
    home.mkdir()
    result = run_cli("train", *TINY, "logger=wandb", "logger.mode=offline", cwd=tmp_path,
                     env={**cli_env(), "HOME": str(home)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert run_dirs(tmp_path)
    assert not (home / ".cache").exists(), sorted(str(p) for p in (home / ".cache").rglob("*"))[:10]
