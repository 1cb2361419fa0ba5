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
from posenc.record.directory import plain_number


def test_a_piped_encodings_list_shows_every_option_whole(tmp_path: Path):
    env = cli_env()
    env.pop("COLUMNS")  # a pipe with no COLUMNS: rich's 80 columns
    result = run_cli("encodings", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    for name, _, options in encoding_catalogue():
        for key, value in options.items():
            assert f"{key}={yaml_value(value)}" in result.stdout, (name, key)
    assert "original_max_len=null" in result.stdout and "${" not in result.stdout  # no interpolated internals
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
                     env={**cli_env(), "HOME": str(home)}, new_python=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert run_dirs(tmp_path)
    assert not (home / ".cache").exists(), sorted(str(p) for p in (home / ".cache").rglob("*"))[:10]


def test_piped_output_keeps_long_paths_and_headers_whole(tmp_path: Path):
    """Without a terminal (a log file, SLURM) and without COLUMNS, rich would wrap at 80 columns
    and a copied report path would break; posenc's consoles are wide there."""
    from test_compare import make_run

    sweep = tmp_path / ("a_sweep_directory_with_a_long_name_" * 3) / "sweep"
    for seed in (0, 1):
        for name in ("rope", "alibi"):
            ppl = {f"extrapolation/ppl@{32 * m}": 12.0 + m + seed for m in (1, 2, 4, 8, 16)}
            make_run(sweep, f"{name}_{seed}", {"name": name, "base": 10000}, seed,
                     [f"encoding={name}", f"seed={seed}"], [3.0, 2.5 + 0.1 * seed], extra=ppl)
    env = cli_env()
    env.pop("COLUMNS")
    result = run_cli("compare", str(sweep), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert f"report: {sweep / 'report.html'}" in result.stdout  # on one line, whole
    lines = result.stdout.splitlines()
    # the perplexity table's header on one line, each interval whole on its group's line
    assert any("n (seeds)" in line and "512" in line for line in lines), result.stdout
    assert any(line.count("[") == line.count("]") == 5 for line in lines if "rope" in line), result.stdout
