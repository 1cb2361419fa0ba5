"""Every command shown in README.md and docs/*.md parses, so the docs cannot drift from the code:
`posenc train` / `eval` / `probe` / `bench` overrides compose into a valid config (a sweep's
first value of each swept key), and every other command and --option exists. The tutorial,
docs/extending.md, is not parsed but run: its files written, its shell blocks run in order in
an empty directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, warm_bin
from typer.main import get_command

from posenc.cli.app import app
from posenc.config import compose, validate
from posenc.config.searchpath import ENV_VAR

pytestmark = pytest.mark.slow  # the docs' commands, each a process of its own

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "extending.md"
PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p != TUTORIAL]
#: flags handled by posenc or Hydra before composition, and placeholders for a run directory
FLAGS = {"-m", "--multirun", "--debug", "--help", "-h", "--cfg", "job", "hydra", "--info", "--config-dir"}
HYDRA_COMMANDS = {"train": False, "eval": True, "probe": True, "bench": False, "generate": True}  # takes a run dir first?


def shown_commands(page: Path) -> list[tuple[str, list[str]]]:
    """(where, argv after 'posenc') of every posenc command in the page's fenced code blocks."""
    out, fenced, pending, start = [], False, "", 0
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        line = re.sub(r"\s+#.*$", "", line) if not line.lstrip().startswith("#") else ""
        if pending:
            line = pending + " " + line.strip()
        else:
            start = n
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        pending = ""
        for part in line.split("&&"):
            words = shlex.split(part)
            at = words.index("posenc") if "posenc" in words else -1
            # `posenc …`, `VAR=1 posenc …`, `torchrun … -m posenc …`; not `script.py --impl posenc`
            if at >= 0 and (all("=" in w for w in words[:at]) or words[at - 1] == "-m"):
                out.append((f"{page.name}:{start}", words[at + 1:]))
    return out


COMMANDS = [c for page in PAGES for c in shown_commands(page)]


def first_of_each_sweep(overrides: list[str]) -> list[str]:
    """key=a,b,c -> key=a (Hydra's own parser decides what a sweep is)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(o.sweep_string_iterator())}")
        else:
            out.append(o.input_line)
    return out


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 40
    assert {argv[0] for _, argv in COMMANDS if argv} >= {"train", "compare", "eval", "bench", "probe", "plot"}


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_documented_command_parses(where: str, argv: list[str]):
    if not argv:
        return
    name, args = argv[0], argv[1:]
    command = get_command(app)
    assert name in command.commands, f"{where}: no command 'posenc {name}'"
    sub = command.commands[name]
    while hasattr(sub, "commands") and args and args[0] in sub.commands:
        sub, args = sub.commands[args[0]], args[1:]
    options = {o for p in sub.params for o in [*p.opts, *p.secondary_opts]}
    if name in HYDRA_COMMANDS:
        options |= FLAGS
        if name == "bench":  # --json [FILE] is posenc's own
            from posenc.cli.bench import split_json_flag

            args, _ = split_json_flag(args)
        if HYDRA_COMMANDS[name] and args and "=" not in args[0]:
            args = args[1:]  # the run directory
        value_options = {o for p in sub.params if not getattr(p, "is_flag", False) for o in p.opts}
        overrides, skip = [], False
        for a in args:
            if skip:
                skip = False
            elif a in value_options:
                skip = True
            elif a.startswith("-") or a in FLAGS:
                assert a in options, f"{where}: posenc {name} has no option {a}"
            elif not a.startswith(("hydra/", "hydra.")):
                overrides.append(a)
        if name == "bench":  # `encoding=a,b` and `encoding=all` pick the models, as the bench reads them
            from posenc.bench.plan import check_encoding_overrides, select_encodings

            names, rest, cfg = select_encodings(overrides)
            check_encoding_overrides(rest, names)
            validate(cfg)
        else:
            validate(compose(first_of_each_sweep(overrides), bench=False))
    else:
        for a in args:
            if a.startswith("--"):
                assert a.split("=")[0] in options, f"{where}: posenc {name} has no option {a}"


def tutorial(page: Path) -> tuple[dict[str, str], str]:
    """({path: text} of the page's ```lang title="path" blocks, its ```bash blocks as one script)."""
    files, script, block, title, lang = {}, [], None, None, None
    for line in page.read_text().splitlines():
        opening = re.match(r'^```(\w+)(?:\s+title="([^"]+)")?\s*$', line)
        if block is None and opening:
            block, lang, title = [], opening.group(1), opening.group(2)
        elif block is not None and line.startswith("```"):
            if title:
                files[title] = "\n".join(block) + "\n"
            elif lang == "bash":
                script += block
            block = None
        elif block is not None:
            block.append(line)
    return files, "\n".join(script)


def test_the_extending_tutorial_runs_from_an_empty_directory(tmp_path: Path):
    """The page's template plug-in (pyproject with its posenc.plugins entry point, the YAMLs as
    package data) is pip-installed and goes through encodings, train, eval, probe, compare, plot,
    bench and check, each command as the page shows it."""
    files, script = tutorial(TUTORIAL)
    assert {"mine/pyproject.toml", "mine/myenc/encodings.py", "mine/myenc/conf/encoding/logdist.yaml"} <= set(files)
    assert {argv[0] for _, argv in shown_commands(TUTORIAL)} >= {"encodings", "train", "eval", "probe", "compare",
                                                                  "plot", "bench", "check"}
    assert "pip install ./mine" in script
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    env = cli_env()
    env.pop(ENV_VAR, None)
    # `posenc` on PATH: each command a fork of one warm interpreter (tests/warm_posenc.py); `pip` this
    # environment's. pip installs offline, with this environment's setuptools (PIP_NO_BUILD_ISOLATION=0
    # is pip's spelling of --no-build-isolation), into site/, which is on PYTHONPATH: the test's
    # environment is left as it was
    site = tmp_path / "site"
    env["PATH"] = os.pathsep.join([str(warm_bin()), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(PIP_TARGET=str(site), PIP_NO_DEPS="1", PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])))
    result = subprocess.run(["bash", "-euo", "pipefail", "-x", "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=1800)  # a guard against a hang
    assert result.returncode == 0, result.stderr[-4000:]
    # installed, not found in the source tree: the module, its YAMLs and the entry point under site/
    assert (site / "myenc" / "conf" / "encoding" / "logdist.yaml").is_file()
    assert list(site.glob("myenc-*.dist-info/entry_points.txt"))
    provenance = json.loads((tmp_path / "outputs/logdist/provenance.json").read_text())
    assert provenance["code"]["myenc.encodings.LogDistanceBias"]["import_root"] == str(site.resolve())
    assert "logdist" in result.stdout and result.stdout.count("properties hold") == 2  # both checks: every row ✓
    assert list((tmp_path / "outputs/logdist/probes").rglob("bias.png")) and (tmp_path / "outputs/report/report_vs-rope.md").is_file()
    assert {p.name for p in (tmp_path / "outputs/layerwise/probes").rglob("bias_layer*.png")} == {
        "bias_layer0.png", "bias_layer1.png"}
