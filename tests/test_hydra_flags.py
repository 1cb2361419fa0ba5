"""Every Hydra flag `posenc train` hands to Hydra (posenc/cli/hydra_argv.py reads them, Hydra's own
app prints what they show): each prints what Hydra's own app would, exits 0 and writes nothing.
These are the branches a Hydra upgrade breaks first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from posenc.cli.app import app


def train(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, result.stdout + result.stderr


def test_posenc_reads_the_very_flags_hydra_documents() -> None:
    # Hydra's parser is private, so posenc/cli/hydra_argv.py writes its flags out: a Hydra release that
    # adds, drops or renames one must fail here, before posenc misreads a command line
    from posenc.cli.hydra_argv import FLAGS

    code, out = train("--hydra-help")
    assert code == 0, out
    flags = out.split("== Flags ==", 1)[1].split("== Configuration groups ==", 1)[0]
    documented = [tuple(m[1].split(",")) for m in re.finditer(r"^(-[-\w]+(?:,-[-\w]+)*) : ", flags, re.MULTILINE)]
    assert documented == [names for names, _ in FLAGS], (
        "Hydra's flags changed: update FLAGS in posenc/cli/hydra_argv.py to what `posenc train --hydra-help` lists")


@pytest.mark.parametrize("overrides", [[], ["encoding=alibi", "trainer.seq_len=32"]])
def test_cfg_job_prints_the_composed_config_with_the_overrides(workdir: Path, overrides: list[str]) -> None:
    code, out = train("--cfg", "job", *overrides)
    assert code == 0, out
    cfg = yaml.safe_load(out)
    assert cfg["encoding"]["name"] == ("alibi" if overrides else "rope")
    assert cfg["trainer"]["seq_len"] == (32 if overrides else 256)
    assert "hydra" not in cfg
    assert not (workdir / "outputs").exists()


def test_cfg_hydra_and_package_select_parts_of_the_config(workdir: Path) -> None:
    code, out = train("--cfg", "hydra")
    assert code == 0, out
    assert yaml.safe_load(out)["hydra"]["sweep"]["dir"].startswith("outputs/sweeps/")
    code, out = train("--cfg", "job", "--package", "trainer", "trainer.max_steps=7")
    assert code == 0, out
    assert yaml.safe_load(out)["max_steps"] == 7
    assert not (workdir / "outputs").exists()


@pytest.mark.parametrize("what, expected", [("searchpath", "pkg://posenc.conf"), ("defaults", "encoding/rope"),
                                            ("config", "seq_len")])
def test_info_prints_hydras_report(workdir: Path, what: str, expected: str) -> None:
    code, out = train("--info", what)
    assert code == 0, out
    assert expected in out
    assert not (workdir / "outputs").exists()


def test_hydra_help_and_shell_completion_print_and_exit(workdir: Path) -> None:
    code, out = train("--hydra-help")
    assert code == 0, out
    assert "--multirun" in out and "--cfg" in out
    code, out = train("--shell-completion", "install=bash")
    assert code == 0, out
    assert "hydra_bash_completion" in out
    assert not (workdir / "outputs").exists()


def test_two_modes_at_once_are_one_error_line(workdir: Path) -> None:
    code, out = train("--cfg", "job", "--info", "all")
    assert code != 0
    assert out.strip().splitlines()[-1].startswith("error: only one of")


def test_a_config_that_sets_hydra_mode_multirun_sweeps_without_dash_m(workdir: Path, monkeypatch) -> None:
    from conftest import TINY, cli_env, run_dirs

    for key, value in cli_env().items():
        monkeypatch.setenv(key, value)
    code, out = train(*TINY, "trainer.max_steps=1", "eval.at_end=false", "hydra.mode=MULTIRUN", "encoding=rope,nope")
    assert code == 0, out[-2000:]
    assert len(run_dirs(workdir)) == 2 and all("sweeps" in str(d) for d in run_dirs(workdir))
    code, out = train(*TINY, "trainer.max_steps=1", "encoding=rope,nope")  # a sweep override, no -m: refused
    assert code != 0 and out.strip().splitlines()[-1].startswith("error:")
