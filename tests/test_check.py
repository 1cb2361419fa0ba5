"""`posenc check`: the encoding contract as properties, run here on every documented option of the
shipped encodings (their default configs, and every layout, are measured by tests/test_verdicts.py,
which holds them to shipped.json), on layouts and mechanisms, on plug-ins kept outside posenc, and
through the command line.

The generic properties every encoding must have (causality, loss at init, default positions,
every attention path against the float64 reference, score_mod = bias, precision, batches,
documents, windows) are tested only here, through the checker users run: one implementation. Each
encoding's paper properties stay in its own test file.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from broken_encodings import (
    ACTIVATION_DTYPE_ROPE,
    BATCH_MEAN_ROPE,
    KERNEL_ALIBI,
    RANDOM_POSITIONS,
    TRAINING_LEAK,
    UNROTATED_CACHE,
    UNSEEDED_ROPE,
    WINDOW_LENGTH,
)

from posenc.check import Status, compose_subject, run_checks
from posenc.config.searchpath import ENV_VAR
from posenc.leaderboard.checked import check_cell

#: layouts (per-kind encodings, windows, chunks) and mechanisms around another encoding (the shipped
#: layouts as they ship: tests/test_verdicts.py)
COMBINATIONS = [
    ["encoding=rope", "layout=gemma3", "layout.window=8"],
    ["encoding=rope", "layout=llama4", "layout.window=8"],
    ["encoding=fox", "encoding@encoding.inner=alibi"],
    ["encoding=sink", "encoding@encoding.inner=ssmax"],
]
#: RoPE's context extensions (conf/encoding/rope.yaml's scaling), 4× the training length
SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
#: every documented option value of the RoPE family that changes what is computed (conf/encoding/*.yaml)
ROTARY_OPTIONS = [
    *[["encoding=rope", f"encoding.scaling={m}", "encoding.scaling_factor=4"] for m in SCALINGS],
    ["encoding=rope", "encoding.scaling=yarn", "encoding.scaling_factor=4", "encoding.truncate=false",
     "encoding.mscale=1", "encoding.mscale_all_dim=0.5"],
    ["encoding=rope", "encoding.style=half"], ["encoding=rope", "encoding.style=half", "encoding.fraction=0.5"],
    *[["encoding=p_rope", f"encoding.scaling={m}", "encoding.scaling_factor=4"] for m in ("linear", "ntk", "yarn")],
    ["encoding=p_rope", "encoding.p=0.25"], ["encoding=p_rope", "encoding.p=1.0"], ["encoding=p_rope", "encoding.p=0.0"],
    ["encoding=p_rope", "encoding.style=half"],
    ["encoding=rope_nope", "encoding.nope_every=1"], ["encoding=rope_nope", "encoding.nope_layers=[0]"],
    ["encoding=rope_nope", "encoding.temperature=log"],
    ["encoding=rope_nope", "encoding.temperature=log", "encoding.temperature_layers=all"],
    *[["encoding=rope_nope", f"encoding.scaling={m}", "encoding.scaling_factor=4"] for m in ("linear", "ntk", "yarn")],
    ["encoding=rope_nope", "encoding.style=half"],
    ["encoding=xpos", "encoding.style=half"],
]
#: ... and of the others
OTHER_OPTIONS = [
    ["encoding=cope", "encoding.per_head=true"], ["encoding=cope", "encoding.npos_max=8"],
    ["encoding=t5_bias", "encoding.bidirectional=true"], ["encoding=t5_bias", "encoding.scale=1.0"],
    ["encoding=t5_bias", "encoding.max_distance=8"],
    ["encoding=sinusoidal", "encoding.scale_embeddings=false"],
    ["encoding=ssmax", "encoding.learned=false"],
    ["encoding=path", "encoding.conv_size=0"], ["encoding=path", "encoding.w_rank=null"],
]
#: the groups an option can move: those that run the encoding's hooks. Left to the default configs'
#: measurement (test_verdicts.py): the state's round trip and resume, loss at init, batches, windows, the
#: fused kernel (none on a CPU) and score_mod's traced backward (an option changes the table's values, not
#: how a score_mod indexes it) — seconds per option the suite need not spend
OPTION_GROUPS = {"causality", "prefix consistency", "default positions", "attention paths", "bias forms",
                 "shift invariance", "precision", "documents packing", "every parameter learns",
                 "past the training length"}

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


''' + WINDOW_LENGTH + TRAINING_LEAK + RANDOM_POSITIONS + KERNEL_ALIBI + ACTIVATION_DTYPE_ROPE + BATCH_MEAN_ROPE \
    + UNSEEDED_ROPE + UNROTATED_CACHE


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
                                ("bf16_rope", "ActivationDtypeRoPE", ""), ("batch_mean_rope", "BatchMeanRoPE", ""),
                                ("unseeded_rope", "UnseededRoPE", ""), ("unrotated_cache", "UnrotatedCacheRoPE", "")):
        (root / "conf" / "encoding" / f"{name}.yaml").write_text(
            f"# a test encoding (tests/broken_encodings.py)\n_target_: logdist_plugin.{target}\nname: {name}\n{extra}")
    return root


def failures(overrides: list[str], groups: set[str] | None = None) -> dict[str, str]:
    rows = run_checks(compose_subject(overrides), only=groups)
    assert len(rows) >= (12 if groups else 15) and all(r.measured or r.status is not Status.PASS for r in rows)
    return {r.name: f"{r.measured}: {r.note}" for r in rows if r.failed}


# each class is one scope of pytest-xdist's loadscope (pyproject's addopts), so two workers share them
class TestEveryDocumentedRotaryOption:
    """RoPE's scalings included: dynamic NTK recomputed its frequencies in float32 inside a float64
    model, and failed the rotary row at 1.9e-6 though it is relative."""

    @pytest.mark.parametrize("overrides", ROTARY_OPTIONS, ids=" ".join)
    def test_keeps_the_contract_in_bf16(self, overrides):
        assert not failures([*overrides, "trainer.precision=bf16"], OPTION_GROUPS)


class TestEveryOtherDocumentedOption:
    @pytest.mark.parametrize("overrides", OTHER_OPTIONS, ids=" ".join)
    def test_keeps_the_contract_in_bf16(self, overrides):
        assert not failures([*overrides, "trainer.precision=bf16"], OPTION_GROUPS)


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


def test_rope_whose_angles_are_computed_in_bf16_fails_the_precision_rows_naming_bf16(plugin, monkeypatch):
    """Angles m·θ in the activations' dtype: exact in float64 and float32 (every row holds in fp32), in
    bf16 rounded to 1 part in 256 of themselves, so that at the evaluation's far positions q·k is no
    longer relative; the note says the error grows with position, in bf16 and not in float32."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    assert not failures(["encoding=bf16_rope"])
    failed = failures(["encoding=bf16_rope", "trainer.precision=bf16"])
    assert set(failed) == {"bf16: hooks = float64 up to position 4096", "bf16: rotary q·k depends on m − n only"}
    hooks = failed["bf16: hooks = float64 up to position 4096"]
    assert "the error of transform_qk grows with position" in hooks and "(trainer.precision=bf16)" in hooks
    assert "in float32 it is" in hooks and "the error comes from bfloat16" in hooks
    assert "the error comes from bfloat16" in failed["bf16: rotary q·k depends on m − n only"]
    assert not failures(["encoding=rope", "trainer.precision=bf16"])  # RoPE's angles in float32: every row holds


def test_an_encoding_that_mixes_the_sequences_of_a_batch_fails_the_batch_row_naming_the_hook(plugin, monkeypatch):
    """The running mean of the batch's keys added to each query: causal, but each sequence reads the
    others, in evaluation and in training; the second measurement names transform_qk."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    [row] = run_checks(compose_subject(["encoding=batch_mean_rope"]), only={"batch independence"})
    assert row.failed and row.note.startswith("in evaluation (model.eval()) and in training (model.train()): ")
    assert "transform_qk reads the other sequences" in row.note
    assert "causal: the future reaches no past logit" not in failures(["encoding=batch_mean_rope"])


def test_a_buffer_no_checkpoint_holds_is_named_where_a_state_row_fails(plugin, monkeypatch):
    """Frequencies drawn from an unseeded generator into a non-persistent buffer: the round trip and
    the resume fail, each note naming the buffer (not the parameters that then train apart)."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    failed = failures(["encoding=unseeded_rope"])
    assert set(failed) == {"safetensors round trip", "resume is bit-exact"}, failed
    for note in failed.values():
        assert "encoding.drawn_freq differs between two builds of the model and is not in the state dict" in note
        assert "wte" not in note


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
