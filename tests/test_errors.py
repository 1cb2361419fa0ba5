"""Every mistake a user can make: one `error:` line on stderr, exit != 0, no traceback, and no
half-written run left under outputs/."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY, cli_env, run_cli, run_dirs


def _corrupt_run(cwd: Path) -> str:
    run = cwd / "outputs" / "old_run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint, a truncated download")
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
    ("unknown experiment", ["experiment=nope_vs_all"], "unknown experiment"),
    ("unknown key", ["trainer.max_stpes=3"], "unknown config key 'trainer.max_stpes'"),
    ("non-numeric", ["trainer.max_steps=abc"], "not an integer"),
    ("non-numeric lr", ["trainer.lr=fast"], "not a number"),
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
]


def run_in_process(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """`posenc train ARGS` through the same Typer app, in this process (no torch import per case)."""
    from typer.testing import CliRunner

    from posenc.cli.app import app

    for key, value in cli_env().items():
        if key.startswith(("HF_", "WANDB_")):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # the CLI sets it for Hydra on every call
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, result.stderr, result.stdout


def assert_one_line_error(code: int, stderr: str, stdout: str, expected: str, workdir: Path, before: set) -> None:
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    assert code != 0, stdout[-2000:]
    assert last.startswith("error:"), stderr[-2000:]
    assert " — " in last and expected in last, last
    assert "Traceback" not in stderr + stdout
    assert set(run_dirs(workdir)) == before  # nothing half-written left behind
    assert not list(workdir.glob("outputs/sweeps/*"))  # not even an empty sweep dir


@pytest.mark.parametrize("args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_error_is_one_line(workdir: Path, monkeypatch: pytest.MonkeyPatch, args: list, expected: str) -> None:
    args = [a(workdir) if callable(a) else a for a in args]
    before = set(run_dirs(workdir))
    assert_one_line_error(*run_in_process([*TINY, *args], monkeypatch), expected, workdir, before)


@pytest.mark.parametrize("args, expected", [(["trainer.max_stpes=3"], "unknown config key"),
                                            (["dataset=tinystories"], "HF_HUB_OFFLINE")])
def test_user_error_from_the_shell(workdir: Path, args: list, expected: str) -> None:
    """The real command in a fresh process: stderr's last line is the error, no traceback anywhere."""
    result = run_cli("train", *TINY, *args, cwd=workdir, timeout=120)
    assert_one_line_error(result.returncode, result.stderr, result.stdout, expected, workdir, set())


def test_debug_shows_the_traceback(workdir: Path) -> None:
    result = run_cli("train", *TINY, "trainer.max_steps=abc", "--debug", cwd=workdir)
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_load_checkpoint_refuses_foreign_files(tmp_path: Path) -> None:
    import torch

    from posenc.rundir import load_checkpoint
    from posenc.errors import UserError

    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a posenc checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(UserError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.parametrize("make_run, expected", [
    (lambda cwd: str(cwd / "outputs" / "no_such_run"), "does not exist"),
    (_corrupt_run, "corrupt or unreadable"),
])
def test_posenc_eval_refuses_a_missing_run_or_a_corrupt_checkpoint(workdir: Path, make_run, expected: str) -> None:
    from typer.testing import CliRunner

    from posenc.cli.app import app

    result = CliRunner().invoke(app, ["eval", make_run(workdir)])
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, expected, workdir, set(run_dirs(workdir)))
