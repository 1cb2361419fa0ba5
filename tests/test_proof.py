"""A checkpoint proves its model (posenc/eval/proof.py): it holds the trained model's outputs on a fixed
probe batch, and whatever rebuilds the model from it (the run's own end, `posenc eval`, `posenc probe`,
a resume, an init_from child) compares. A RoPE whose frequencies come from an unseeded generator into a
non-persistent buffer (tests/broken_encodings.py) trains, and its checkpoint cannot rebuild it: every
rebuild warns once, naming the buffer, and records it, and `posenc compare` and `posenc plot
extrapolation` mark its arm. A shipped encoding's checkpoint proves itself in a fresh process and on
another thread count; a checkpoint from before probes were saved says it cannot prove, and nothing fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from broken_encodings import IMPORTS, UNSEEDED_ROPE
from conftest import TINY, cli_env, run_cli
from omegaconf import OmegaConf

from posenc.build import build_model, seed_everything
from posenc.config import compose, group_options
from posenc.config.searchpath import ENV_VAR
from posenc.eval import proof
from posenc.record.statefile import load_state, save_state

RUN = [*TINY, "check=false", "eval.at_end=true", "eval.lengths=[1,2]"]
#: TINY's model, as every shipped encoding builds it
MODEL = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "trainer.seq_len=32"]
BUFFER = "encoding.drawn_freq"
NOT_REPRODUCED = "does not reproduce the logits it was saved with"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unseeded")
    (root / "unseeded_plugin.py").write_text(IMPORTS + UNSEEDED_ROPE)
    (root / "conf" / "encoding").mkdir(parents=True)
    (root / "conf" / "encoding" / "unseeded_rope.yaml").write_text(
        "# frequencies from an unseeded generator (tests/broken_encodings.py)\n"
        "_target_: unseeded_plugin.UnseededRoPE\nname: unseeded_rope\n")
    return root


def plugin_env(plugin: Path, **extra: str) -> dict[str, str]:
    """The environment of a process of its own (its warnings printed as a user sees them) that imports
    the plug-in and finds its configs."""
    return {**cli_env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin), os.environ.get("PYTHONPATH")])),
            ENV_VAR: str(plugin / "conf"), **extra}


@pytest.fixture
def on_path(plugin: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plug-in importable and its configs found, for commands run in this process."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setenv(ENV_VAR, str(plugin / "conf"))
    return plugin


@pytest.fixture(scope="module")
def runs(plugin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A TINY run of the unseeded RoPE and one of RoPE, each a process of its own, evaluated at 1× and
    2× at their end."""
    cwd = tmp_path_factory.mktemp("runs")
    out = {}
    for name in ("unseeded_rope", "rope"):
        result = run_cli("train", f"encoding={name}", *RUN, f"hydra.run.dir={name}", cwd=cwd, env=plugin_env(plugin))
        assert result.returncode == 0, result.stderr[-3000:]
        out[name] = cwd / name
        out[f"{name} stderr"] = result.stderr
    return out


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_run_whose_checkpoint_cannot_rebuild_its_model_says_so_at_its_end(runs):
    """The run rebuilds its kept checkpoint once more at its end, in its own process: two builds of the
    model disagree on the buffer, so the run warns once and records it; RoPE's proves itself."""
    [line] = [w for w in warnings_in(runs["unseeded_rope stderr"]) if NOT_REPRODUCED in w]
    assert BUFFER in line and "checkpoints/last.safetensors" in line
    [record] = summary(runs["unseeded_rope"])["checkpoint_proofs"]
    assert record["holds"] is False and BUFFER in record["cause"] and record["at"] == "end of training, step 4"
    assert record["logprob_max_diff"] > 100 * record["tolerance"]["logprob"]
    [record] = summary(runs["rope"])["checkpoint_proofs"]
    assert record["holds"] is True and not warnings_in(runs["rope stderr"])


def test_eval_of_such_a_run_warns_once_naming_the_buffer_and_records_it(runs, on_path):
    """The issue's case: the training-time ppl@64 was one number, each `posenc eval` another, and
    eval.json said nothing. Now each evaluation warns and eval.json records why."""
    run = runs["unseeded_rope"]
    trained = summary(run)["extrapolation/ppl@64"]
    for _ in range(2):
        result = run_cli("eval", str(run), "--no-check", "eval.lengths=[2]", cwd=run.parent)
        assert result.returncode == 0, result.stderr[-3000:]
        [line] = warnings_in(result.stderr)
        assert NOT_REPRODUCED in line and f"the non-persistent buffer {BUFFER} differs between two builds" in line
        record = json.loads((run / "eval_lengths-2.json").read_text())
        assert record["checkpoint_proof"]["holds"] is False and BUFFER in record["checkpoint_proof"]["cause"]
        assert record["extrapolation/ppl@64"] != trained  # another model's number (4 steps in: a small difference)

    probed = run_cli("probe", str(run), "--no-check", cwd=run.parent)
    assert probed.returncode == 0 and sum(NOT_REPRODUCED in w for w in warnings_in(probed.stderr)) == 1
    assert json.loads((run / "probes" / "probes.json").read_text())["checkpoint_proof"]["holds"] is False


def test_a_changed_code_is_named_before_a_buffer(runs, plugin, tmp_path):
    """Seeding the generator is a code change: the eval of the run (a process of its own, importing
    today's module from a copy of the plug-in) names the changed definition as what differs."""
    copy = Path(shutil.copytree(plugin, tmp_path / "plugin"))
    run = Path(shutil.copytree(runs["unseeded_rope"], tmp_path / "run"))
    source = copy / "unseeded_plugin.py"
    source.write_text(source.read_text().replace("draw.seed()", "draw.manual_seed(0)"))
    result = run_cli("eval", str(run), "--no-check", "eval.lengths=[1]", cwd=tmp_path, env=plugin_env(copy))
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [w for w in warnings_in(result.stderr) if NOT_REPRODUCED in w]
    assert "the code changed since training" in line and "UnseededRoPE.__init__ changed" in line, line
    assert BUFFER not in line


def test_compare_and_plot_extrapolation_mark_the_arm(runs, tmp_path):
    both = [str(runs["unseeded_rope"]), str(runs["rope"])]
    compared = run_cli("compare", *both, "--no-check", "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-3000:]
    text = " ".join(compared.stdout.split())
    assert "unseeded_rope ✗ckpt" in text and "rope ✗ckpt" not in text.replace("unseeded_rope ✗ckpt", "")
    assert f"unseeded_rope ✗ckpt: 1 of its 1 runs' checkpoints do not rebuild the model that trained" in text
    assert BUFFER in (tmp_path / "report" / "report.md").read_text()
    plotted = run_cli("plot", "extrapolation", *both, "--no-check", "--out", str(tmp_path / "x.png"), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    assert "warning: unseeded_rope ✗ckpt:" in " ".join(plotted.stdout.split())


def test_resume_and_init_from_compare(runs, plugin, tmp_path):
    """A resume of the run and a fine-tune started from it each rebuild the model in a process of their
    own: each warns and records it in its summary (an init_from child in its parent entry too)."""
    run = Path(shutil.copytree(runs["unseeded_rope"], tmp_path / "outputs" / "run"))
    resumed = run_cli("train", f"trainer.resume={run}", "trainer.max_steps=5", cwd=tmp_path, env=plugin_env(plugin))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    proofs = summary(run)["checkpoint_proofs"]
    assert [p["at"] for p in proofs] == ["resume at step 4", "end of training, step 5"]
    assert proofs[0]["holds"] is False and BUFFER in proofs[0]["cause"]
    assert sum(NOT_REPRODUCED in w for w in warnings_in(resumed.stderr)) == 2  # the resume's, the end's

    child = run_cli("train", "encoding=unseeded_rope", *RUN, "eval.at_end=false", f"trainer.init_from={run}",
                    "hydra.run.dir=child", cwd=tmp_path, env=plugin_env(plugin))
    assert child.returncode == 0, child.stderr[-3000:]
    parent = summary(tmp_path / "child")["parent"]["checkpoint_proof"]
    assert parent["holds"] is False and parent["at"] == f"init_from {run.resolve()}"
    assert summary(tmp_path / "child")["checkpoint_proofs"][0] == parent


def test_a_shipped_encodings_checkpoint_proves_itself_in_a_fresh_process_on_any_thread_count(runs, tmp_path):
    """RoPE's run, evaluated by a process of its own on another torch thread count than it trained on,
    and resumed: no warning, and each record holds (tests below: how far thread counts move logits)."""
    run = Path(shutil.copytree(runs["rope"], tmp_path / "outputs" / "run"))
    other = 1 if summary(run)["machine/threads"] > 1 else 2
    result = run_cli("eval", str(run), "--no-check", "eval.lengths=[1]", cwd=tmp_path,
                     env={**cli_env(), "OMP_NUM_THREADS": str(other)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert not warnings_in(result.stderr), result.stderr
    assert json.loads((run / "eval_lengths-1.json").read_text())["checkpoint_proof"]["holds"] is True
    resumed = run_cli("train", f"trainer.resume={run}", "trainer.max_steps=5", cwd=tmp_path, env=cli_env())
    assert resumed.returncode == 0 and not warnings_in(resumed.stderr), resumed.stderr[-3000:]
    assert [p["holds"] for p in summary(run)["checkpoint_proofs"]] == [True, True]


def test_a_checkpoint_without_a_probe_cannot_prove_and_fails_nothing(runs, tmp_path):
    run = Path(shutil.copytree(runs["rope"], tmp_path / "run"))
    checkpoint = run / "checkpoints" / "last.safetensors"
    state = load_state(checkpoint)
    del state[proof.KEY]  # as checkpoints were written before they held one
    save_state(state, checkpoint)
    result = run_cli("eval", str(run), "--no-check", "eval.lengths=[1]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = warnings_in(result.stderr)
    assert "cannot prove" in line and "saved before checkpoints held a probe batch" in line
    assert json.loads((run / "eval_lengths-1.json").read_text())["checkpoint_proof"]["holds"] is None
    compared = run_cli("compare", str(run), "--no-check", "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert compared.returncode == 0 and "✗ckpt" not in compared.stdout


def test_float32_reassociation_across_thread_counts_stays_within_the_derived_tolerance():
    """At a shape users run (head_dim 64, GPT-2's vocabulary, a window of 64: the probe's), the same
    weights on 1 and on 2 threads give logits that differ in their last bits, well inside the tolerance
    derived for float32; a model whose RoPE frequencies moved by 1e-3 is far outside it."""
    cfg = compose(["model.n_layer=4", "model.n_head=4", "model.d_model=256", "trainer.seq_len=64"], bench=False)
    seed_everything(0)
    model = build_model(cfg, 50257)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits at a trained model's scale (tens), not an initial model's
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        saved = proof.probe(model, 64)
        torch.set_num_threads(2)
        now = proof.outputs(model, saved["tokens"])
    finally:
        torch.set_num_threads(before)
    assert proof.compare(saved, now)["holds"]
    model.encoding.inv_freq.mul_(1 + 1e-3)
    model.encoding.cos_cached = model.encoding.cos_cached[:0]  # the cache rebuilt from the moved frequencies
    moved = proof.compare(saved, proof.outputs(model, saved["tokens"]))
    assert not moved["holds"] and moved["logprob_max_diff"] > 10 * moved["tolerance"]["logprob"]


def test_the_probe_leaves_training_as_it_was():
    """Computing the probe between two steps changes neither the RNGs nor the model's mode nor its
    kernel record: a resume from that checkpoint continues bit for bit (tests/test_resume.py)."""
    cfg = compose(TINY, bench=False)
    seed_everything(0)
    model = build_model(cfg, 256).train()
    record, rng = model.kernels.record(), torch.get_rng_state()
    saved = proof.probe(model, 32)
    assert model.training and torch.equal(torch.get_rng_state(), rng) and model.kernels.record() == record
    assert saved["tokens"].shape == (2, 32) and saved["logprob"].shape == (2, 31) and saved["logits"].shape == (2, 256)
    assert saved["logits"].dtype == torch.float32


REBUILD = """
import json, sys
from omegaconf import OmegaConf
from posenc.config.load import typed_run_config
from posenc.eval import proof
from posenc.record.statefile import load_state

out = {}
for name, path in json.loads(sys.argv[1]).items():
    saved = load_state(path)
    model = proof.rebuild(typed_run_config(OmegaConf.create(saved["config"]), []), 256)  # as a run dir is read
    model.load_state_dict(saved["model"])
    out[name] = proof.verify(model, saved, path, lambda: [], None)
print(json.dumps(out))
"""


def test_every_shipped_encodings_checkpoint_proves_itself_in_another_process_on_another_thread_count(tmp_path):
    """Each shipped encoding's model, its weights and probe saved here, rebuilt by a new Python on
    another thread count from its config and seed alone: its outputs are the saved ones (no shipped
    encoding draws a buffer the seed does not reach)."""
    saved = {}
    for name in group_options("encoding"):
        cfg = compose([*MODEL, f"encoding={name}"], bench=False)
        model = proof.rebuild(cfg, 256)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))  # weights of their own, as a trained model's: a checkpoint's
        path = tmp_path / f"{name}.safetensors"
        save_state({"model": model.state_dict(), proof.KEY: proof.probe(model, 32),
                    "config": OmegaConf.to_container(cfg, resolve=True)}, path)
        saved[name] = str(path)
    other = 1 if torch.get_num_threads() > 1 else 2
    result = subprocess.run([sys.executable, "-c", REBUILD, json.dumps(saved)], capture_output=True, text=True,
                            timeout=300, env={**cli_env(), "OMP_NUM_THREADS": str(other)})
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(result.stdout.strip().splitlines()[-1])
    assert records.keys() == saved.keys()
    assert {name: r for name, r in records.items() if not r["holds"]} == {}
