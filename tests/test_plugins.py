"""An encoding kept outside posenc (a package made here, in a temp dir, put on PYTHONPATH) goes
through every command by one mechanism, the config search path (posenc/config/searchpath.py):
`--config-dir` on any command, POSENC_CONFIG_PATH, or a `posenc.plugins` entry point. A run
records where its encoding's code came from (posenc/record/provenance.py), and what posenc draws and
probes comes from the hooks an encoding offers, not from its name."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from conftest import TINY, cli_env, run_cli, run_dirs
from typer.testing import CliRunner

from posenc.config.searchpath import ENV_VAR
from posenc.errors import UserError

ENCODINGS_PY = '''\
"""Two encodings a researcher keeps in their own package."""
import math

import torch
from torch import Tensor, nn

from posenc.nn.encodings.base import PositionalEncoding
from posenc.nn.encodings.rope import apply_rotary

from .distances import causal_distance


class LogDistanceBias(PositionalEncoding):
    """b_h(i, j) = -s_h * log(1 + i - j), a learned slope s_h > 0 per head."""

    def __init__(self, d_model: int, n_head: int, name: str = "logdist", init_slope: float = 1.0,
                 slope_lr_scale: float = 1.0) -> None:
        super().__init__(d_model, n_head, name)
        self.log_slope = nn.Parameter(torch.full((n_head,), math.log(init_slope)))  # (H,)
        self.slope_lr_scale = slope_lr_scale

    def distance_bias(self, distance: Tensor) -> Tensor:  # (R,) -> (H, R); posenc derives the rest
        return -self.log_slope.exp()[:, None] * torch.log1p(distance.float())[None, :]

    def param_groups(self):
        return [([self.log_slope], {"lr_scale": self.slope_lr_scale, "weight_decay": 0.0})]


class NormalisedDistance(PositionalEncoding):
    """b_h(i, j) = -s_h * (i - j) / (i + 1): a bias of i and j apart (absolute), no distance table."""

    def __init__(self, d_model: int, n_head: int, name: str = "normalised_distance") -> None:
        super().__init__(d_model, n_head, name)
        self.slope = nn.Parameter(torch.ones(n_head))

    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        n = causal_distance(q_pos, k_pos).to(self.slope.dtype)
        return -self.slope[:, None, None] * (n / (q_pos[..., :, None] + 1).to(self.slope.dtype)).unsqueeze(-3)


class LearnedRoPE(PositionalEncoding):
    """RoPE whose frequencies theta_i are learned, starting at base^(-2i/d)."""

    def __init__(self, d_model: int, n_head: int, name: str = "learned_rope", base: float = 10000.0) -> None:
        super().__init__(d_model, n_head, name)
        theta = base ** (-torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.log_theta = nn.Parameter(theta.log())  # (head_dim/2,)

    def rotary_frequencies(self, layer: int = 0) -> Tensor:
        return self.log_theta.exp().detach()

    def transform_qk(self, q, k, ctx, layer=0):
        angles = ctx.pos.float()[..., None] * self.log_theta.exp()  # (T, hd/2) or (B, T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]
        return apply_rotary(q, cos, sin, "interleaved"), apply_rotary(k, cos, sin, "interleaved")
'''

DISTANCES_PY = '''\
"""A helper module of the plug-in, imported by encodings.py."""


def causal_distance(q_pos, k_pos):
    """(..., Tq), (..., Tk) -> (..., Tq, Tk): i - j, the future clamped to 0."""
    return (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0)
'''

LOGDIST_YAML = """\
# Log-distance bias: -s_h·log(1 + i - j), a learned slope per head.
_target_: myplug.encodings.LogDistanceBias
name: logdist
init_slope: 1.0
slope_lr_scale: 1.0
"""
LEARNED_ROPE_YAML = """\
# RoPE with learned frequencies.
_target_: myplug.encodings.LearnedRoPE
name: learned_rope
base: 10000.0
"""


ABSOLUTE_YAML = """\
# A bias of i and j apart: -s_h·(i - j)/(i + 1).
_target_: myplug.encodings.NormalisedDistance
name: normalised_distance
"""


def make_plugin(root: Path) -> Path:
    """root/myplug: a package with two encodings and its config dir, myplug/conf; returns conf."""
    package = root / "myplug"
    (package / "conf" / "encoding").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "conf" / "__init__.py").write_text("")
    (package / "encodings.py").write_text(ENCODINGS_PY)
    (package / "distances.py").write_text(DISTANCES_PY)
    (package / "conf" / "encoding" / "logdist.yaml").write_text(LOGDIST_YAML)
    (package / "conf" / "encoding" / "learned_rope.yaml").write_text(LEARNED_ROPE_YAML)
    (package / "conf" / "encoding" / "normalised_distance.yaml").write_text(ABSOLUTE_YAML)
    return package / "conf"


def plugin_env(root: Path, **extra: str) -> dict[str, str]:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env.pop(ENV_VAR, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> tuple[Path, Path]:
    """(the directory holding the plugin package, its config dir), importable in this process."""
    root = tmp_path_factory.mktemp("plugin")
    conf = make_plugin(root)
    sys.path.insert(0, str(root))
    yield root, conf
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "myplug" or m.startswith("myplug.")]:
        del sys.modules[name]


@pytest.fixture
def on_search_path(plugin, monkeypatch):
    """The plugin's config dir on POSENC_CONFIG_PATH for one in-process test."""
    monkeypatch.setenv(ENV_VAR, str(plugin[1]))
    return plugin


@pytest.fixture(scope="module")
def sweep(plugin, tmp_path_factory) -> dict[str, Path]:
    """encoding name -> run dir of a 2-job sweep over the plugin's encodings, through Hydra's
    submitit launcher (each job in a process of its own), from a directory that holds neither
    the plugin nor its configs: `posenc train -m --config-dir … encoding=logdist,learned_rope`."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra is not installed")
    root, conf = plugin
    cwd = tmp_path_factory.mktemp("runs")
    result = run_cli("train", "-m", "hydra/launcher=submitit_local", "--config-dir", str(conf),
                     "encoding=logdist,learned_rope", *TINY, "eval.at_end=true", "eval.lengths=[1,2]",
                     "eval.tokens=128", cwd=cwd, env=plugin_env(root))
    assert result.returncode == 0, result.stderr[-3000:]
    return {json.loads((d / "summary.json").read_text())["encoding"]["name"]: d for d in run_dirs(cwd)}


@pytest.fixture(scope="module")
def trained(sweep) -> Path:
    return sweep["logdist"]


def test_the_run_records_its_encoding_code_and_config_dir(trained, plugin):
    record = json.loads((trained / "provenance.json").read_text())
    code = record["code"]["myplug.encodings.LogDistanceBias"]
    assert code["module"] == "myplug.encodings" and code["import_root"] == str(plugin[0].resolve())
    assert code["file"] == str((plugin[0] / "myplug" / "encodings.py").resolve())
    # what importing it runs: the module and the helper it imports (the empty __init__.py runs nothing), and
    # the modules of posenc it imports (base.py, rope.py for apply_rotary) and theirs
    assert {f for f in code["sources"] if not f.startswith("posenc/")} == {"myplug/encodings.py", "myplug/distances.py"}
    assert {"posenc/nn/encodings/base.py", "posenc/nn/encodings/rope.py"} <= set(code["sources"])
    assert "LogDistanceBias.distance_bias" in code["definitions"]["myplug/encodings.py"]
    assert len(code["sha256"]) == 64 and record["posenc_version"]
    assert record["config_dirs"][0] == f"file://{plugin[1].resolve()}"
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["encoding"] == {"name": "logdist", "init_slope": 1, "slope_lr_scale": 1}  # options() by default


def test_both_sweep_jobs_trained_their_plugin_encoding(sweep):
    assert set(sweep) == {"logdist", "learned_rope"}
    for name, run_dir in sweep.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and math.isfinite(summary["val/loss"]), name
        assert (run_dir / "provenance.json").is_file()


def test_eval_and_probe_from_another_directory(trained, on_search_path, tmp_path, monkeypatch):
    from posenc.eval.probe_run import probe_run
    from posenc.eval.run import eval_run

    from posenc.check.verdict import carried

    monkeypatch.chdir(tmp_path)
    record, path = eval_run(trained, ["eval.lengths=[1,2]"], verdict_of=carried)
    assert path.is_file() and record["encoding"]["name"] == "logdist"
    assert record["code_changes"] == []  # the code it was trained with
    # measured once, by the sweep's job (another process), and found here by its key
    assert record["check"]["holds"] is True and record["check"]["from"] == "cache"
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["check"]["key"] == record["check"]["key"] and summary["check"]["from"] == "measured"
    assert all(math.isfinite(v) for k, v in record.items() if k.startswith("extrapolation/ppl@"))
    written = {p.name for p in probe_run(trained, [], multiples=(1,), windows=1)}
    assert "bias.png" in written and "rotary_pairs.png" not in written  # a bias, drawn as one


def test_probe_runs_on_a_plugins_absolute_bias(on_search_path, tmp_path):
    """A bias that is not a function of i - j (no distance_bias): trained, then `posenc probe` draws
    its rows at three query positions, which differ, instead of failing on a distance table."""
    from posenc.eval.probe_run import probe_run

    trained = run_cli("train", "--config-dir", str(on_search_path[1]), *TINY, "encoding=normalised_distance",
                      cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    [run] = run_dirs(tmp_path)
    written = {p.name for p in probe_run(run, [], multiples=(1,), windows=1)}
    assert "bias.png" in written
    [bias] = json.loads((run / "probes" / "probes.json").read_text())["32"]["bias"]
    assert not bias["relative"] and set(bias["by_query"]) == {"7", "15", "31"}
    assert bias["by_query"]["7"][0][1] != bias["by_query"]["31"][0][1]  # b(i, i - 1) changes with i


def test_bench_labels_the_plugin_row_by_its_name_and_pairs_it_with_nope(on_search_path):
    from posenc.bench.run import Listener, bench

    shape = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "bench.seq_len=16", "bench.batch_size=2",
             "bench.steps=1", "bench.warmup=1", "bench.rounds=1", "bench.reference=false",
             "bench.eval_length_multiple=0", "device=cpu"]
    result = bench(["encoding=logdist,nope", *shape], Listener())
    rows = {r["name"]: r for r in result["results"]}
    assert set(rows) == {"logdist", "nope"} and rows["logdist"]["status"] == "ok"
    assert rows["logdist"]["options"] == {"init_slope": 1, "slope_lr_scale": 1}
    # its own row, timed round by round against nope's (not nope against itself: 1.000×)
    assert rows["logdist"]["vs_nope"] > 0 and rows["logdist"]["paired"]["nope"]


def test_encodings_lists_the_plugin_with_its_options(plugin, monkeypatch):
    from posenc.cli.app import app

    # --config-dir sets POSENC_CONFIG_PATH for this process; conftest restores it after the test
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["encodings", "--config-dir", str(plugin[1])])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "logdist" in line)
    assert "Log-distance bias" in line and "init_slope=1.0" in line
    assert "learned_rope" in result.output and "rope " in result.output  # the built-ins stay


def test_compare_and_plot_read_the_plugin_run(trained, tmp_path, monkeypatch):
    from posenc.cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["compare", str(trained), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report" / "report.md").is_file() and "logdist" in result.output
    result = CliRunner().invoke(app, ["plot", "extrapolation", str(trained), "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x.png").is_file()


def test_an_installed_plugins_entry_point_is_on_the_search_path(plugin, tmp_path, monkeypatch):
    from posenc.config import compose, group_options

    installed(tmp_path, "myplug")
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert "logdist" not in group_options("encoding")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "logdist" in group_options("encoding")
    assert compose(["encoding=logdist"]).encoding._target_ == "myplug.encodings.LogDistanceBias"


def installed(site: Path, package: str) -> None:
    """What `pip install` of a package declaring [project.entry-points."posenc.plugins"] leaves in site."""
    dist = site / f"{package}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[posenc.plugins]\n{package} = {package}.conf\n")


def test_shadowing_is_never_silent_and_follows_the_one_search_order(plugin, tmp_path, monkeypatch, capsys):
    """posenc's own configs, then POSENC_CONFIG_PATH (--config-dir), then installed plug-ins: the
    first file of a name is used, and composing it says in one line which one it shadows."""
    from posenc.config import compose
    from posenc.config.searchpath import SEARCH_ORDER, group_options

    installed(tmp_path / "site", "myplug")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    mine = tmp_path / "mine" / "encoding"
    mine.mkdir(parents=True)
    (mine / "rope.yaml").write_text(LOGDIST_YAML.replace("name: logdist", "name: rope"))
    (mine / "logdist.yaml").write_text(LOGDIST_YAML.replace("init_slope: 1.0", "init_slope: 2.0"))
    monkeypatch.setenv(ENV_VAR, str(mine.parent))
    assert compose(["encoding=rope"]).encoding._target_ == "posenc.nn.encodings.rope.RoPE"  # posenc's own first
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: encoding=rope uses encoding/rope.yaml from posenc's own configs; "
                           f"the one in {mine.parent.resolve()} is shadowed")
    assert compose(["encoding=logdist"]).encoding.init_slope == 2.0  # a directory of yours before an installed plug-in
    [line] = capsys.readouterr().err.splitlines()
    assert f"from {mine.parent.resolve()}; the one in the installed plug-in myplug.conf is shadowed" in line
    assert compose(["encoding=learned_rope"]).encoding.name == "learned_rope"  # in one source only: nothing said
    assert capsys.readouterr().err == "" and "learned_rope" in group_options("encoding")
    assert "posenc's own configs first, then --config-dir and POSENC_CONFIG_PATH" in SEARCH_ORDER

    from posenc.cli.app import app

    result = CliRunner().invoke(app, ["encodings"])
    assert result.exit_code == 0 and sorted(line.split(" uses ")[0] for line in result.stderr.splitlines()) == [
        "warning: encoding=logdist", "warning: encoding=rope"]


def test_a_hydra_searchpath_of_your_own_still_adds_sources_after_the_plugins(plugin, tmp_path, monkeypatch):
    """posenc hands Hydra the plug-ins' sources as hydra.searchpath, which Hydra reads once: a
    hydra.searchpath on the command line is merged in, after them (as after Hydra's --config-dir)."""
    from posenc.config import compose

    (tmp_path / "encoding").mkdir()
    (tmp_path / "encoding" / "logdist.yaml").write_text(LOGDIST_YAML.replace("init_slope: 1.0", "init_slope: 3.0"))
    (tmp_path / "encoding" / "only_mine.yaml").write_text(LOGDIST_YAML.replace("name: logdist", "name: only_mine"))
    monkeypatch.setenv(ENV_VAR, str(plugin[1]))
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    assert compose([searchpath, "encoding=only_mine"]).encoding.name == "only_mine"
    assert compose([searchpath, "encoding=logdist"]).encoding.init_slope == 1.0  # the plug-in's, first


def test_an_argument_the_yaml_does_not_set_is_explained_not_mistaken_for_a_typo(plugin, tmp_path, monkeypatch):
    """Hydra's key=value changes only keys the YAML has: for a constructor argument the YAML leaves
    out, the one line says so and how to set it (+key=), not "did you mean encoding.name?"."""
    from posenc.cli.explain import explain
    from posenc.config import compose

    (tmp_path / "encoding").mkdir()
    (tmp_path / "encoding" / "bare.yaml").write_text("_target_: myplug.encodings.LogDistanceBias\nname: bare\n")
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(Exception) as raised:
        compose(["encoding=bare", "encoding.init_slope=2"])
    assert explain(raised.value).startswith("encoding.init_slope is an argument of myplug.encodings.LogDistanceBias, "
                                            "but encoding/bare.yaml does not set it")
    assert "+encoding.init_slope=" in explain(raised.value)
    assert compose(["encoding=bare", "+encoding.init_slope=2"]).encoding.init_slope == 2.0


def test_an_unimportable_target_is_one_line_naming_the_module_and_pythonpath(plugin, monkeypatch):
    from posenc.config import compose

    monkeypatch.setenv(ENV_VAR, str(plugin[1]))
    with pytest.raises(UserError, match=r"cannot import module 'nowhere\.enc' .*PYTHONPATH=.*pip install -e"):
        compose(["encoding=logdist", "encoding._target_=nowhere.enc.LogDistanceBias"])


def test_a_run_whose_module_is_gone_says_where_it_imported_it_from(trained, plugin, monkeypatch):
    from posenc.record import provenance

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin[0])])
    for name in [m for m in sys.modules if m == "myplug" or m.startswith("myplug.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UserError, match=f"PYTHONPATH={plugin[0].resolve()} \\(where the run imported it from\\)"):
        provenance.changes(trained)


def test_changed_code_eval_warns_resume_refuses_unless_allowed(trained, plugin, capsys):
    from posenc.cli.launch import prepare
    from posenc.eval.run import warn_code_changes
    from posenc.record import provenance

    source = plugin[0] / "myplug" / "encodings.py"
    original = source.read_text()
    assert provenance.changes(trained) == []
    try:
        source.write_text(original.replace("torch.log1p(distance.float())", "torch.log1p(2 * distance.float())"))
        warn_code_changes(trained)
        warning = capsys.readouterr().err
        assert "warning: the encoding code changed" in warning and "myplug.encodings.LogDistanceBias" in warning
        assert "myplug/encodings.py: LogDistanceBias.distance_bias changed" in warning and "distances.py" not in warning
        with pytest.raises(UserError, match=r"trainer.allow_code_change=true"):
            prepare([f"trainer.resume='{trained}'", "trainer.max_steps=6"])
        result = run_cli("train", f"trainer.resume='{trained}'", "trainer.max_steps=6", "trainer.allow_code_change=true",
                         cwd=trained.parent, env=plugin_env(plugin[0]))  # the run's config dir comes from the run
        assert result.returncode == 0, result.stderr[-3000:]
        record = json.loads((trained / "provenance.json").read_text())
        assert record["earlier"] and record["earlier"][-1]["code"] != record["code"]  # both versions kept
    finally:
        source.write_text(original)


def test_provenance_is_the_code_the_encoding_imports_and_names_each_changed_file(trained, plugin):
    """An empty __init__.py added to the package, or a module the encoding never imports, changes
    nothing; a helper module it imports does, and the warning names that file (not encodings.py)."""
    from omegaconf import OmegaConf

    from posenc.record import provenance

    provenance.write(trained, OmegaConf.load(trained / ".hydra" / "config.yaml"))  # the code as it is now
    package = plugin[0] / "myplug"
    helper = package / "distances.py"
    added = [package / "conf" / "encoding" / "__init__.py", package / "unused.py"]
    original = helper.read_text()
    try:
        added[0].write_text("")
        added[1].write_text("x = 1\n")
        assert provenance.changes(trained) == []
        helper.write_text(original + "\n\ndef unused():\n    return 0\n")
        [line] = provenance.changes(trained)
        assert line == "myplug.encodings.LogDistanceBias (myplug/distances.py: unused (new))"
    finally:
        helper.write_text(original)
        for path in added:
            path.unlink(missing_ok=True)


def test_the_files_an_import_runs_are_read_from_the_source(tmp_path):
    """Relative and absolute imports, at the top or inside a function, transitively within the
    top-level package; nothing outside it; empty files left out."""
    from posenc.record.imports import package_sources

    files = {"pkg/__init__.py": "", "pkg/sub/__init__.py": "from .deep import g\n", "pkg/sub/deep.py": "g = 1\n",
             "pkg/enc.py": "import torch\nfrom .helpers import f\n\ndef later():\n    import pkg.sub.mod\n",
             "pkg/helpers.py": "from pkg import sub\nf = 1\n", "pkg/sub/mod.py": "m = 1\n", "pkg/unused.py": "u = 1\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {str(p.relative_to(tmp_path)) for p in package_sources("pkg.enc", tmp_path)}
    assert found == {"pkg/enc.py", "pkg/helpers.py", "pkg/sub/__init__.py", "pkg/sub/deep.py", "pkg/sub/mod.py"}


def test_a_missing_config_dir_is_one_line(tmp_path):
    result = run_cli("encodings", "--config-dir", str(tmp_path / "nope"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: --config-dir '{tmp_path / 'nope'}' does not exist — pass a directory of YAML configs "
        f"(one holding encoding/NAME.yaml)"]
