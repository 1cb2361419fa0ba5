"""`posenc check`: the encoding contract as properties, run here on every shipped encoding (and on
layouts and mechanisms), on plug-ins kept outside posenc, and through the command line.

The generic properties every encoding must have (causality, loss at init, default positions,
every attention path against the float64 reference, score_mod = bias, documents, windows) are
tested only here, through the checker users run: one implementation. Each encoding's paper
properties stay in its own test file.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from broken_encodings import KERNEL_ALIBI, RANDOM_POSITIONS, TRAINING_LEAK, UNROTATED_CACHE, WINDOW_LENGTH

from posenc.check import Status, compose_subject, run_checks
from posenc.config import group_options
from posenc.config.searchpath import ENV_VAR
from posenc.leaderboard.checked import check_cell

ENCODINGS = group_options("encoding")
#: layouts (per-kind encodings, windows, chunks) and mechanisms around another encoding
COMBINATIONS = [
    ["encoding=rope", "layout=gemma3", "layout.window=8"],
    ["encoding=rope", "layout=llama4", "layout.window=8"],
    ["layout=qwen3_next"],   # 3 gated-delta : 1 softmax with partial RoPE: a recurrent kind has no window
    ["encoding=fox", "encoding@encoding.inner=alibi"],
    ["encoding=sink", "encoding@encoding.inner=ssmax"],
]

PLUGIN = '''
"""An additive log-distance bias b_h(n) = -softplus(a_h)·log(1 + n), a researcher's own encoding;
with ``offset`` it also adds a learned per-head constant c_h, which softmax cancels."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc.nn.encodings.base import PositionalEncoding


class LogDistance(PositionalEncoding):
    def __init__(self, d_model: int, n_head: int, name: str = "log_distance", offset: bool = False) -> None:
        super().__init__(d_model, n_head, name)
        self.slope = nn.Parameter(torch.zeros(n_head))
        self.offset = nn.Parameter(torch.zeros(n_head)) if offset else None

    def distance_bias(self, distance):  # (R,) -> (H, R): the one form; posenc derives position_bias, score_mod
        b = -F.softplus(self.slope)[:, None] * torch.log1p(distance.to(self.slope.dtype))[None, :]
        return b + self.offset[:, None] if self.offset is not None else b


''' + WINDOW_LENGTH + TRAINING_LEAK + RANDOM_POSITIONS + KERNEL_ALIBI + UNROTATED_CACHE


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """A plug-in kept outside posenc: a module and its YAMLs in a directory of their own."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "logdist_plugin.py").write_text(PLUGIN)
    (root / "conf" / "encoding").mkdir(parents=True)
    for name, offset in (("logdist", "false"), ("logdist_offset", "true")):
        (root / "conf" / "encoding" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            # a log-distance bias{' with a per-head constant offset' if offset == 'true' else ''}
            _target_: logdist_plugin.LogDistance
            name: {name}
            offset: {offset}
            """))
    for name, target, extra in (("window_length", "WindowLength", ""), ("training_leak", "TrainingLeak", ""),
                                ("random_rope", "RandomPositionsRoPE", ""), ("kernel_alibi", "KernelALiBi", ""),
                                ("kernel_alibi_doubled", "KernelALiBi", "kernel_factor: 2.0\n"),
                                ("unrotated_cache", "UnrotatedCacheRoPE", "")):
        (root / "conf" / "encoding" / f"{name}.yaml").write_text(
            f"# a test encoding (tests/broken_encodings.py)\n_target_: logdist_plugin.{target}\nname: {name}\n{extra}")
    return root


def failures(overrides: list[str]) -> dict[str, str]:
    rows = run_checks(compose_subject(overrides))
    assert len(rows) >= 15 and all(r.measured or r.status is not Status.PASS for r in rows)
    return {r.name: f"{r.measured}: {r.note}" for r in rows if r.failed}


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_shipped_encoding_keeps_the_contract(name):
    """FIRE's included: its MLP's output bias, a per-head constant softmax cancels, is gone."""
    assert not failures([f"encoding={name}"])


@pytest.mark.parametrize("overrides", COMBINATIONS, ids=lambda o: " ".join(o))
def test_layouts_and_mechanisms_keep_the_contract(overrides):
    assert not failures(overrides)


def test_the_checks_say_what_does_not_apply():
    """RoPE has no position bias: those rows say so (—), they neither pass nor fail."""
    rows = {r.name: r for r in run_checks(compose_subject(["encoding=rope"]))}
    assert rows["score_mod = position_bias = distance_bias"].status is Status.NOT_OFFERED
    assert "no position bias" in rows["score_mod = position_bias = distance_bias"].note
    assert rows["rotary q·k depends on m − n only"].status is Status.PASS
    assert rows["bias depends on i − j only"].note == "not offered: no position bias"  # not "not relative"


def test_a_learned_per_head_constant_is_flagged_and_a_learned_slope_is_not(plugin, monkeypatch):
    """The plug-in's log-distance slope learns; its per-head offset, added to every logit of a row,
    gets a gradient of ~1e-16 of the others (softmax cancels it): ✗, naming the parameter."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    assert not failures(["encoding=logdist"])
    failed = failures(["encoding=logdist_offset"])
    assert list(failed) == ["every parameter can learn"]
    assert "encoding.offset cannot learn" in failed["every parameter can learn"]


def test_a_bias_that_reads_the_window_length_fails_the_prefix_row_and_every_note_says_so(plugin, monkeypatch):
    """-(i - j)(T - i)/T keeps causality (tokens change, T does not), so only running the first t
    tokens alone shows it; the documents and chunked rows it also fails name the same cause, and decoding,
    which asks it for one query's row at a time, gives other logits."""
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    monkeypatch.syspath_prepend(str(plugin))
    failed = failures(["encoding=window_length"])
    assert set(failed) == {"prefix: first t tokens = them alone", "documents: B after A = B alone",
                           "chunked (long eval) = reference", "decoding: cached = full forward"}, failed
    assert "position_bias reads the window's length — its output for the first 12 positions differs between a " \
        "window of 24 and one of 12, and not when only the inputs after them change" in failed[
            "prefix: first t tokens = them alone"]
    assert "though no document sees another" in failed["documents: B after A = B alone"]
    assert "position_bias reads the window's length" in failed["documents: B after A = B alone"]
    assert "it reads how many positions it is given" in failed["chunked (long eval) = reference"]


def test_a_hook_that_breaks_causality_fails_that_row(plugin, monkeypatch):
    """An embedding that mixes in the mean of the whole window lets every token see its future
    (and a document the documents before it)."""
    monkeypatch.syspath_prepend(str(plugin))
    import logdist_plugin

    class Leaky(logdist_plugin.LogDistance):
        def embed(self, x, ctx):
            return x + x.mean(dim=1, keepdim=True)  # (B, T, C) + (B, 1, C): the future leaks

    monkeypatch.setattr(logdist_plugin, "LogDistance", Leaky)
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    failed = failures(["encoding=logdist"])
    assert "a token sees the tokens after it" in failed["causal: the future reaches no past logit"]
    assert "a document sees another" in failed["documents: B after A = B alone"]


def test_a_future_leak_in_training_only_fails_naming_training_and_the_hook(plugin, monkeypatch):
    """The embedding adds the window's mean only while training: evaluation keeps every property, and
    the causal, documents and windows rows fail in training, the causal note naming the hook."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    failed = failures(["encoding=training_leak"])
    assert set(failed) == {"causal: the future reaches no past logit", "documents: B after A = B alone",
                           "windows: nothing beyond L·(w−1) = 6"}, failed
    assert all("in training (model.train()): " in note and "evaluation" not in note for note in failed.values())
    assert failed["causal: the future reaches no past logit"].startswith("eval max |Δ| 0.0e+00; train max |Δ| ")
    assert "a token sees the tokens after it" in failed["causal: the future reaches no past logit"]
    assert "embed reads later tokens" in failed["causal: the future reaches no past logit"]


def test_random_positions_in_training_keep_the_contract(plugin, monkeypatch):
    """Ruoss et al. (2023): a sorted random subset of [0, L_max) as the positions in training, 0..T-1 in
    evaluation. A legitimate difference: every property holds in both modes."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    rows = {r.name: r for r in run_checks(compose_subject(["encoding=random_rope"]))}
    assert not [r for r in rows.values() if r.failed], [r for r in rows.values() if r.failed]
    assert "train max |Δ| 0.0e+00" in rows["causal: the future reaches no past logit"].measured


def test_an_own_kernel_is_held_to_its_hooks_and_a_disagreeing_one_fails_naming_the_hook(plugin, monkeypatch):
    """A learned-slope ALiBi with a kernel of its own (SDPA over its bias as a float mask) keeps the
    contract, its kernel compared (✓, not —); the same kernel with its slopes doubled fails the
    fused-kernel row alone, in both modes, the note naming distance_bias."""
    from posenc.check.kernel import NAME

    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    rows = {r.name: r for r in run_checks(compose_subject(["encoding=kernel_alibi"]))}
    assert rows[NAME].status is Status.PASS and "5 masks" in rows[NAME].measured
    assert not [r for r in rows.values() if r.failed]
    [row] = run_checks(compose_subject(["encoding=kernel_alibi_doubled"]), only={"fused kernel"})
    assert row.failed and row.note.startswith("in evaluation (model.eval()) and in training (model.train()): ")
    assert "a term of the head and i − j alone" in row.note and "disagrees with distance_bias" in row.note


def test_a_cache_that_keeps_keys_unrotated_fails_the_decoding_row_alone_naming_what_it_keeps(plugin, monkeypatch):
    """Its hooks are RoPE's (every other row holds); decoding with its cache gives other logits from the first
    decoded position on, and the note says what the cache keeps."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    failed = failures(["encoding=unrotated_cache"])
    assert list(failed) == ["decoding: cached = full forward"]
    assert "from position 5" in failed["decoding: cached = full forward"]
    assert "keys as they came (unrotated)" in failed["decoding: cached = full forward"]


def test_a_cache_that_goes_stale_passes_held_to_each_prefix_and_says_why():
    """Dynamic NTK beyond its original length: decoding runs the sequence again, so the row holds, held to
    each prefix's forward, with the reason as a caveat the leaderboard's table carries."""
    (row,) = run_checks(compose_subject(["encoding=rope", "encoding.scaling=dynamic", "encoding.scaling_factor=2"]),
                        only={"decoding"})
    assert row.status is Status.PASS and "stale beyond 24" in row.caveat and "prefix" in row.note
    record = {"version": "x", "failed": [], "caveats": [f"{row.name}: {row.caveat}"]}
    assert check_cell(record).startswith("✓ (decoding: cached = full forward: cache stale beyond 24")


def test_the_command_checks_a_plugin_and_exits_1_on_a_failed_property(plugin, monkeypatch):
    """`posenc check --config-dir DIR encoding=NAME`, the plug-in's module importable (PYTHONPATH)."""
    from typer.testing import CliRunner

    from posenc.cli.app import app

    monkeypatch.syspath_prepend(str(plugin))
    result = CliRunner().invoke(app, ["check", "--config-dir", str(plugin / "conf"), "encoding=logdist_offset"])
    assert result.exit_code == 1, result.output
    row = next(line for line in result.stdout.splitlines() if "every parameter can learn" in line)
    assert "✗" in row and "encoding.offset" in result.stdout
    measured = sum("│ ✓ │" in line or "│ ✗ │" in line for line in result.stdout.splitlines())
    assert result.stdout.splitlines()[-1] == f"1 of {measured} properties fail: every parameter can learn"
    assert "causal:" in result.stdout and not result.stderr.strip()


def test_the_command_exits_0_when_every_property_holds_and_one_line_on_a_config_mistake(tmp_path):
    from typer.testing import CliRunner

    from posenc.cli.app import app

    ok = CliRunner().invoke(app, ["check", "encoding=alibi"])
    assert ok.exit_code == 0, ok.output
    measured = sum("│ ✓ │" in line for line in ok.stdout.splitlines())
    assert ok.stdout.splitlines()[-1].startswith(f"all {measured} properties hold")
    for argv in (["check", "encoding=alibx"], ["check", "model.n_head=5"],
                 ["check", "--config-dir", str(tmp_path / "missing"), "encoding=rope"]):
        bad = CliRunner().invoke(app, argv)
        assert bad.exit_code == 1 and bad.stdout == "", bad.output
        assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: "), bad.stderr


def test_only_runs_the_named_groups_and_refuses_an_unknown_one():
    """`posenc check --only cuda` (scripts/gpu_check.sh runs it for every encoding): the CUDA rows
    alone, "not offered" without a GPU; a group that does not exist is one `error:` line naming the
    groups there are."""
    import torch
    from typer.testing import CliRunner

    from posenc.check import cuda
    from posenc.cli.app import app

    result = CliRunner().invoke(app, ["check", "--only", "CUDA", "--only", "causality", "encoding=t5_bias"])
    assert result.exit_code == 0, result.output
    names = [name for d in cuda.HEAD_DIMS for name in cuda.names(d)]
    assert all(name in result.stdout for name in names) and "causal:" in result.stdout
    assert "loss at init" not in result.stdout and "resume" not in result.stdout
    if not torch.cuda.is_available():
        assert result.stdout.count("not offered: no CUDA device") == len(names)
    bad = CliRunner().invoke(app, ["check", "--only", "cuda-rows", "encoding=rope"])
    assert bad.exit_code == 1 and bad.stdout == "", bad.output
    assert bad.stderr.startswith("error: --only cuda-rows") and "cuda" in bad.stderr and bad.stderr.count("\n") == 1
