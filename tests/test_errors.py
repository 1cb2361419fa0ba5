"""Every mistake a user can make: one `error:` line on stderr, exit != 0, no traceback, and no
half-written run left under outputs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TINY, cli_env, run_cli, run_dirs


def _corrupt_run(cwd: Path) -> str:
    run = cwd / "outputs" / "old_run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "checkpoints" / "last.safetensors").write_bytes(b"not a checkpoint, a truncated download")
    return str(run)


def _empty_file(cwd: Path) -> str:
    (cwd / "empty.txt").write_text("")
    return str(cwd / "empty.txt")


def _short_file(cwd: Path) -> str:
    (cwd / "short.txt").write_text("".join(f"line {i}\n" for i in range(400)))  # ~3 kB, two blocks
    return str(cwd / "short.txt")


def _unreadable(cwd: Path) -> str:
    return str(cwd)  # a directory where a file is expected


# (case id, overrides, text the error line must contain); a callable builds a fixture first
CASES = [
    ("unknown encoding", ["encoding=rotary"], "unknown encoding 'rotary'"),
    ("value typo", ["encoding=ropee"], "did you mean encoding=rope?"),
    ("unknown experiment", ["experiment=nope_vs_all"], "unknown experiment"),
    ("unknown key", ["trainer.max_stpes=3"], "unknown config key 'trainer.max_stpes'"),
    ("negative size", ["trainer.batch_size=-4"], "must be positive"),
    ("d_model % n_head", ["model.d_model=30", "model.n_head=4"], "not divisible"),
    ("odd RoPE head dim", ["model.d_model=34"], "head_dim"),
    ("learned max_len", ["encoding=learned", "encoding.max_len=16"], "max_len=16"),
    ("cuda absent", ["device=cuda"], "CUDA is not available"),
    ("hub dataset", ["dataset=wikitext2"], "HF_HUB_OFFLINE"),
    ("hub tokenizer", ["tokenizer=gpt2"], "HF_HUB_OFFLINE"),
    ("missing file", ["dataset=text", "dataset.files=[no/such/file.txt]"], "does not exist"),
    ("unreadable file", ["dataset=text", lambda c: f"dataset.files=[{_unreadable(c)}]"], "not a file"),
    ("empty corpus", ["dataset=text", lambda c: f"dataset.files=[{_empty_file(c)}]"], "document"),
    ("shorter than a window", ["dataset=text", "dataset.lines_per_doc=100", "trainer.seq_len=4000",
                               lambda c: f"dataset.files=[{_short_file(c)}]"], "fewer than one window"),
    ("missing run dir", ["trainer.resume=outputs/never_ran"], "does not exist"),
    ("corrupt checkpoint", [lambda c: f"trainer.resume={_corrupt_run(c)}"], "corrupt"),
    ("resume nothing", ["trainer.resume=auto"], "no run under"),
    ("sweep bad key", ["model.depth=2", "-m", "encoding=rope,nope"], "unknown config key"),
    # refused while Hydra composes the jobs, after its sweeper saved multirun.yaml: no stub sweep dir
    ("sweep unknown choice", ["-m", "encoding=rope,ropee"], "did you mean encoding=rope?"),
    ("sweep option one choice lacks", ["-m", "encoding=rope,alibi", "encoding.style=half"], "alibi has no option style ("),
    ("top-level key typo", ["traner.max_steps=5"], "unknown config key 'traner.max_steps' (there is no 'traner') — "
                                                   "did you mean trainer.max_steps?"),
]

# A wrong type or an unknown key is refused by the schema (posenc/config/schema.py) while Hydra
# composes: the line carries OmegaConf's own words, the full key, and the type the schema
# declares, or the schema node the key is not in. (case id, overrides, texts the line must hold)
SCHEMA_CASES = [
    ("int", ["trainer.max_steps=abc"], ["trainer.max_steps=abc", "could not be converted to Integer", "takes an int"]),
    ("float", ["trainer.lr=fast"], ["trainer.lr=fast", "could not be converted to Float", "takes a float"]),
    ("optional", ["trainer.peak_flops=x"], ["trainer.peak_flops", "takes a float or null"]),
    ("bool", ["eval.at_end=maybe"], ["eval.at_end", "not a valid bool"]),
    ("list", ["eval.lengths=3"], ["eval.lengths", "takes a list of"]),
    ("unknown key", ["trainer.max_stpes=3"], ["unknown config key 'trainer.max_stpes'", "not in 'TrainerConfig'",
                                             "did you mean trainer.max_steps?"]),
    ("model key", ["model.depth=2"], ["unknown config key 'model.depth'", "not in 'ModelConfig'"]),
    # per choice: the schema is the __init__ signature of the class _target_ names
    ("encoding float", ["encoding.base=abc"], ["encoding.base=abc", "could not be converted to Float", "takes a float"]),
    ("encoding int", ["encoding=learned", "encoding.max_len=x"], ["encoding.max_len", "takes an int"]),
    ("encoding key", ["+encoding.bsae=3"], ["unknown config key 'encoding.bsae'", "not in 'RoPE'",
                                            "did you mean encoding.base?"]),
    ("dataset int", ["dataset=text", "dataset.files=[a.txt]", "dataset.lines_per_doc=many"],
     ["dataset.lines_per_doc", "takes an int"]),
]


def run_in_process(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """`posenc train ARGS` through the same Typer app, in this process (no torch import per case)."""
    from typer.testing import CliRunner

    from posenc.cli.app import app

    for key, value in cli_env().items():
        if key.startswith(("HF_", "WANDB_")):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # a user's setting: it would ask for the traceback
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, result.stderr, result.stdout


def assert_one_line_error(code: int, stderr: str, stdout: str, expected: str, workdir: Path, before: set) -> None:
    """Exit != 0, stderr's last line is `error: what — what to do` holding expected, no
    traceback, and no run or sweep directory left behind."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    assert code != 0, stdout[-2000:]
    assert last.startswith("error:"), stderr[-2000:]
    assert " — " in last and expected in last, last
    assert "Traceback" not in stderr + stdout
    assert "Error executing job" not in stderr  # Hydra's own line for a failed job: posenc's is the only one
    assert set(run_dirs(workdir)) == before  # nothing half-written left behind
    if not before:
        assert not (workdir / "outputs").exists()  # not even an empty outputs/
    assert not list(workdir.glob("outputs/sweeps/*"))  # not even an empty sweep dir


@pytest.mark.parametrize("args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_error_is_one_line(workdir: Path, monkeypatch: pytest.MonkeyPatch, args: list, expected: str) -> None:
    args = [a(workdir) if callable(a) else a for a in args]
    before = set(run_dirs(workdir))
    assert_one_line_error(*run_in_process([*TINY, *args], monkeypatch), expected, workdir, before)


@pytest.mark.parametrize("args, expected", [c[1:] for c in SCHEMA_CASES], ids=[c[0] for c in SCHEMA_CASES])
def test_wrong_type_or_unknown_key_is_the_schemas_error(workdir: Path, monkeypatch: pytest.MonkeyPatch, args: list,
                                                        expected: list) -> None:
    code, stderr, stdout = run_in_process([*TINY, *args], monkeypatch)
    assert_one_line_error(code, stderr, stdout, "", workdir, set())
    last = stderr.strip().splitlines()[-1]
    assert all(text in last for text in expected), last


@pytest.mark.parametrize("yaml_file, text, expected", [
    ("trainer/fast.yaml", "defaults: [default, _self_]\nmax_steps: abc\n", ["trainer/fast", "trainer.max_steps",
                                                                            "takes an int"]),
    ("trainer/typo.yaml", "defaults: [default, _self_]\nmax_stpes: 3\n", ["unknown config key 'trainer.max_stpes'"]),
    ("encoding/myrope.yaml", "_target_: posenc.nn.encodings.rope.RoPE\nname: myrope\nbase: ten\n",
     ["encoding.base", "takes a float"]),
    ("encoding/myrope.yaml", "_target_: posenc.nn.encodings.rope.RoPE\nname: myrope\nbsae: 10\n",
     ["unknown config key 'encoding.bsae'", "not in 'RoPE'"]),
])
def test_a_user_yaml_with_a_wrong_type_or_key_is_refused_by_the_schema(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       yaml_file: str, text: str, expected: list) -> None:
    """A config of the user's own (--config-dir) extends the same schema as ours."""
    path = workdir / "my_conf" / yaml_file
    path.parent.mkdir(parents=True)
    path.write_text(text)
    group, choice = yaml_file[: -len(".yaml")].split("/")
    code, stderr, stdout = run_in_process(["--config-dir", str(workdir / "my_conf"), *TINY, f"{group}={choice}"],
                                          monkeypatch)
    assert_one_line_error(code, stderr, stdout, "", workdir, set())
    last = stderr.strip().splitlines()[-1]
    assert all(text in last for text in expected), last


@pytest.mark.parametrize("d_model, n_head", [(256, 3), (30, 4), (96, 5), (64, 7), (100, 8)])
def test_the_head_split_fix_it_suggests_is_valid(d_model: int, n_head: int) -> None:
    """Following either fix the d_model % n_head error suggests gives a config that validates and
    builds RoPE (which needs an even head_dim), not the next error."""
    from posenc.build import build_encoding
    from posenc.config import compose, validate
    from posenc.errors import UserError

    shape = [f"model.d_model={d_model}", f"model.n_head={n_head}"]
    cfg = compose(shape)
    with pytest.raises(UserError, match="not divisible") as refused:
        validate(cfg)
    fixes = re.findall(r"(model\.(?:d_model|n_head)=\d+)", str(refused.value).split(" — ", 1)[1])
    assert len(fixes) == 2, str(refused.value)
    for fix in fixes:
        fixed = compose([*shape, fix])
        validate(fixed)
        build_encoding(fixed)


@pytest.mark.parametrize("args, expected", [(["trainer.max_stpes=3"], "unknown config key"),
                                            (["dataset=tinystories"], "HF_HUB_OFFLINE")])
def test_user_error_from_the_shell(workdir: Path, args: list, expected: str) -> None:
    """The real command in a fresh process: stderr's last line is the error, no traceback anywhere."""
    result = run_cli("train", *TINY, *args, cwd=workdir, timeout=120, fresh_process=True)
    assert_one_line_error(result.returncode, result.stderr, result.stdout, expected, workdir, set())


def test_debug_shows_the_traceback(workdir: Path) -> None:
    result = run_cli("train", *TINY, "trainer.max_steps=abc", "--debug", cwd=workdir)
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_load_checkpoint_refuses_foreign_files(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from posenc.errors import UserError
    from posenc.record.rundir import load_checkpoint

    save_file({"weights": torch.zeros(2)}, tmp_path / "other.safetensors")  # someone else's safetensors
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")  # a pickle, whatever its name
    for path in ("other.safetensors", "other.pt"):
        with pytest.raises(UserError, match="not a posenc checkpoint"):
            load_checkpoint(tmp_path / path)
    with pytest.raises(UserError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("make_run, expected", [
    (lambda cwd: str(cwd / "outputs" / "no_such_run"), "does not exist"),
    (_corrupt_run, "is not a posenc checkpoint, or is corrupt"),
])
def test_posenc_eval_refuses_a_missing_run_or_a_corrupt_checkpoint(workdir: Path, make_run, expected: str) -> None:
    from typer.testing import CliRunner

    from posenc.cli.app import app

    result = CliRunner().invoke(app, ["eval", make_run(workdir)])
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, expected, workdir, set(run_dirs(workdir)))


def test_an_option_another_encoding_has_names_those_that_have_it(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "did you mean encoding.name?": which encodings take the option, read from their configs."""
    from posenc.config import encoding_options, group_options

    code, stderr, stdout = run_in_process([*TINY, "encoding=alibi", "encoding.style=half"], monkeypatch)
    assert_one_line_error(code, stderr, stdout, "alibi has no option style (", workdir, set())
    owners = re.search(r"no option style \(([^)]*) have it\)", stderr)[1].split(", ")
    assert owners == [e for e in group_options("encoding") if "style" in encoding_options(e)]
    assert {"rope", "p_rope", "xpos"} <= set(owners) and "did you mean" not in stderr


def test_posenc_eval_of_a_sweep_dir_lists_its_runs_and_the_command_for_one(workdir: Path) -> None:
    import shlex

    from typer.testing import CliRunner

    from posenc.cli.app import app

    sweep = workdir / "kept" / "10-00-00-000000_encoding-rope,nope"  # a sweep dir moved out of outputs/
    for job in ("0_encoding=rope", "1_encoding=nope"):
        (sweep / job / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    # trainer.checkpoint=none (the README's sweep): no run to evaluate, so no `posenc eval` to paste
    result = CliRunner().invoke(app, ["eval", str(sweep)])
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, "is a sweep dir, not one run, and its runs "
                          "(0_encoding=rope, 1_encoding=nope) kept no checkpoint (trainer.checkpoint=none) to eval",
                          workdir, set(run_dirs(workdir)))
    assert "`posenc eval" not in result.stderr and f"`posenc compare {sweep}`" in result.stderr
    (sweep / "1_encoding=nope" / "checkpoints").mkdir()
    (sweep / "1_encoding=nope" / "checkpoints" / "last.safetensors").write_bytes(b"")
    result = CliRunner().invoke(app, ["eval", str(sweep)])
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, "is a sweep dir, not one run; its runs: "
                          "0_encoding=rope, 1_encoding=nope", workdir, set(run_dirs(workdir)))
    command = re.search(r"eval one with `([^`]*)`", result.stderr)[1]
    assert shlex.split(command) == ["posenc", "eval", str(sweep / "1_encoding=nope")]  # the one with a checkpoint


def test_a_missing_text_file_is_refused_before_a_run_directory_is_named(workdir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal comes before Hydra makes (and names) a run directory: no 'run dir: …' line for
    a directory that is then removed."""
    code, stderr, stdout = run_in_process([*TINY, "dataset=text", "dataset.files=[no/such/file.txt]"], monkeypatch)
    assert_one_line_error(code, stderr, stdout, "'no/such/file.txt' does not exist", workdir, set())
    assert "run dir" not in stdout + stderr


@pytest.mark.parametrize("command", ["eval", "probe"])
def test_eval_of_a_folder_that_is_not_a_run_says_so_and_names_a_run_under_it(workdir: Path, command: str) -> None:
    from typer.testing import CliRunner

    from posenc.cli.app import app

    parent = workdir / "outputs" / "2026-11-22"
    (parent / "16-58-28-111496_rope" / ".hydra").mkdir(parents=True)  # trained with trainer.checkpoint=none
    result = CliRunner().invoke(app, [command, str(parent)])
    before = set(run_dirs(workdir))
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, "is not a run directory", workdir, before)
    assert "kept no checkpoint to " in result.stderr and "trainer.checkpoint=last" in result.stderr
    # the run it names is one that can be evaluated, not the first it finds
    (parent / "17-00-00-000000_alibi" / "checkpoints").mkdir(parents=True)
    (parent / "17-00-00-000000_alibi" / ".hydra").mkdir()
    (parent / "17-00-00-000000_alibi" / "checkpoints" / "last.safetensors").write_bytes(b"")
    result = CliRunner().invoke(app, [command, str(parent)])
    before = set(run_dirs(workdir))
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, "is not a run directory", workdir, before)
    assert f"`posenc {command} {parent / '17-00-00-000000_alibi'}`" in result.stderr
    empty = workdir / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, [command, str(empty)])
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, "no run under it", workdir, before)
