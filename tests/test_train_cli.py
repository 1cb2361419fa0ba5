"""`posenc train` end to end, as a user runs it: the run directory and its files."""

import json

import pytest
import torch
import yaml
from conftest import TINY, run_cli, run_dirs

METRIC_NAMES = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss", "val/ppl", "val/bpb"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("train")
    result = run_cli("train", *TINY, "logger=wandb", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    return cwd, run_dir, result


def test_the_run_directory_records_the_run_as_it_was_asked_for(trained):
    """.hydra/ holds the overrides as typed and the config they composed (what a resume and
    `posenc eval` read), the log its steps, and W&B an offline run."""
    _, run_dir, _ = trained
    assert yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == [*TINY, "logger=wandb"]
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert config["trainer"]["max_steps"] == 4 and config["model"]["d_model"] == 32 and config["encoding"]["name"] == "rope"
    log = (run_dir / "train.log").read_text()
    assert "step 4/4" in log and "val ppl" in log
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B should write an offline run"
    assert run_dir.parent.parent.name == "outputs"


def test_metrics_have_tokens_in_every_row_and_the_documented_names(trained):
    _, run_dir, _ = trained
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all("tokens" in r for r in rows)
    assert [r["tokens"] for r in rows] == [4 * 32 * s for s in (1, 2, 3, 4)]  # batch · seq_len · step
    names = set().union(*rows) - {"step", "tokens", "elapsed_s"}  # elapsed_s: seconds of training, for convergence
    assert names == METRIC_NAMES
    assert "val/loss" in rows[1] and "val/loss" not in rows[0]  # eval every 2 steps


def test_summary(trained):
    _, run_dir, _ = trained
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed"
    assert s["encoding"] == {"name": "rope", "base": 10000.0, "fraction": 1.0, "style": "interleaved"}
    assert s["tokens"] == 4 * 4 * 32 and s["steps"] == 4
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert s["tokens"] == rows[-1]["tokens"]  # one name, one quantity: tokens seen
    assert s["params"] > 0 and s["wall_time_s"] > 0 and s["tokens_per_s"] > 0
    assert abs(s["val/ppl"] - torch.tensor(s["val/loss"]).exp().item()) < 1e-3
    # byte tokenizer: one token per byte, so bits per byte = nats per token / ln 2
    assert s["val/bpb"] == pytest.approx(s["val/loss"] / torch.log(torch.tensor(2.0)).item())


def test_the_checkpoint_holds_the_trained_model(trained):
    """The saved weights are the ones the summary measured: evaluated again on the same
    validation windows they give the run's final val/ppl."""
    from posenc.eval.run import eval_run
    from posenc.record.rundir import load_checkpoint

    _, run_dir, _ = trained
    ckpt = load_checkpoint(run_dir)
    assert ckpt["step"] == 4 and ckpt["tokens"] == 512 and ckpt["config"]["encoding"]["name"] == "rope"
    s = json.loads((run_dir / "summary.json").read_text())
    record, _ = eval_run(run_dir, ["eval.lengths=[1]", f"eval.tokens={2 * 4 * 32}"])  # TINY's validation windows
    assert record["extrapolation/ppl@32"] == pytest.approx(s["val/ppl"], rel=1e-5)


def test_progress_and_table_are_printed(trained):
    _, run_dir, result = trained
    assert "val/ppl" in result.stdout and "tok/s" in result.stdout


def test_same_seed_same_losses(tmp_path):
    """Same seed and config -> the same losses, step for step, on CPU."""
    args = [*TINY, "encoding=t5_bias"]
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        assert run_cli("train", *args, cwd=tmp_path / sub).returncode == 0
    rows = [(run_dirs(tmp_path / sub)[0] / "metrics.jsonl").read_text().splitlines() for sub in ("a", "b")]
    losses = [[json.loads(r)["train/loss"] for r in rs] for rs in rows]
    assert losses[0] == losses[1]


def test_sweep_over_two_bases_leaves_two_runs(tmp_path):
    result = run_cli("train", "-m", *TINY, "trainer.max_steps=2", "encoding.base=100,10000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    runs = run_dirs(tmp_path)
    assert len(runs) == 2
    bases = sorted(json.loads((r / "summary.json").read_text())["encoding"]["base"] for r in runs)
    assert bases == [100.0, 10000.0]
    assert all("sweeps" in r.parts for r in runs)


@pytest.mark.parametrize("args, message", [
    (["encoding=foo"], "unknown encoding 'foo'"),
    (["trainer.foo=1"], "unknown config key 'trainer.foo'"),
    (["encoding=learned", "trainer.seq_len=64", "encoding.max_len=32"], "max_len=32"),
])
def test_user_mistakes_print_one_error_line(tmp_path, args, message):
    result = run_cli("train", *TINY, *args, cwd=tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and message in last
    assert "Traceback" not in result.stderr + result.stdout
    assert run_dirs(tmp_path) == []  # no half-written run left behind


def test_encodings_command_lists_every_encoding(tmp_path):
    from posenc.config import encoding_catalogue, group_options

    result = run_cli("encodings", cwd=tmp_path)
    assert result.returncode == 0
    for name in (*group_options("encoding"), "base=10000", "num_buckets=32", "truncate=true"):
        assert name in result.stdout
    # rope's description (the table's middle column) says where its defaults are not Hugging Face's
    docs = {name: doc for name, doc, _ in encoding_catalogue()}
    assert "Defaults that differ from HF's" in docs["rope"] and "llama3" in docs["rope"]


def test_train_help_shows_typer_and_hydra_groups(tmp_path):
    result = run_cli("train", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "Hydra overrides" in result.stdout  # Typer's help text
    assert "encoding:" in result.stdout and "rope" in result.stdout  # Hydra's config groups


def test_plot_writes_under_outputs_plots_not_into_the_current_directory(tmp_path):
    result = run_cli("plot", "decay", "--head-dim", "16", "--max-distance", "32", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "outputs" / "plots" / "rope_decay.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob("*.png"))


def test_no_encoding_parameter_is_weight_decayed():
    """One optimiser rule for every encoding: its own parameters (T5's table, learned positions)
    learn free of weight decay, the model's matrices are decayed."""
    import torch
    from omegaconf import OmegaConf

    from posenc.build import build_model
    from posenc.config import compose
    from posenc.train.state import configure_optimizer

    for name in ("t5_bias", "learned"):
        model = build_model(compose([f"encoding={name}", "model.n_layer=1", "model.d_model=32", "model.n_head=2"]), 256)
        opt = configure_optimizer(model, OmegaConf.create({"weight_decay": 0.1, "lr": 1e-3, "beta1": 0.9, "beta2": 0.95}),
                                  torch.device("cpu"))
        decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
        for n, p in model.named_parameters():
            expected = 0.0 if n.startswith("encoding.") or p.dim() < 2 else 0.1
            assert decay_of[id(p)] == expected, n
