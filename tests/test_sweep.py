"""Sweeps as a user types them: `posenc train -m ...`, then `posenc compare` on the result."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import TINY, run_cli, run_dirs
from wandb_records import offline_run

from posenc.config import group_options
from posenc.leaderboard.protocol import load_protocol
from posenc.record.directory import job_dir_name, sweep_group, sweep_name


def sweep_dirs(cwd: Path) -> list[Path]:
    return sorted(p.parent for p in (cwd / "outputs" / "sweeps").rglob("multirun.yaml"))


@pytest.mark.slow  # a sweep of every encoding, then compare
def test_smoke_experiment_runs_every_encoding_and_compare_reports_it(workdir: Path):
    """lightning-hydra-template's sweep test: every encoding on a tiny budget, then the report."""
    result = run_cli("train", "-m", "experiment=smoke", *TINY, cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    [sweep] = sweep_dirs(workdir)
    assert re.fullmatch(r"\d\d-\d\d-\d\d-\d{6}_smoke", sweep.name)  # <time to the µs>_<name>
    runs = run_dirs(workdir)
    assert len(runs) == len(group_options("encoding")) >= 5  # one run dir per job
    assert sorted(r.name.split("_", 1)[1] for r in runs) == [f"encoding={e}" for e in group_options("encoding")]
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert "convergence/val_loss_auc" in summary and "convergence/tokens_to_loss@2.5" in summary
    meta = json.loads((sweep / "sweep.json").read_text())
    assert meta["name"] == "smoke" and "experiment=smoke" in meta["overrides"]
    assert meta["launcher"]["_target_"].endswith("BasicLauncher")

    result = run_cli("compare", str(sweep), cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in group_options("encoding"):
        assert name in result.stdout
    for produced in ("report.md", "report.html", "convergence.png", "final_val_ppl.png"):
        assert (sweep / produced).stat().st_size > 0
    report = (sweep / "report.md").read_text()
    assert "| encoding | n (seeds) | val/loss |" in report
    # 4 steps never bring a byte-level loss down through 2.5: no column of "never", and it says so
    assert "convergence targets left out: 2.5" in report and not (sweep / "tokens_to_loss.png").exists()


def test_a_base_sweep_shares_one_wandb_group_and_compares_by_base(workdir: Path):
    result = run_cli("train", "-m", "encoding=rope", "encoding.base=100,10000", *TINY, "logger=wandb",
                     "logger.mode=offline", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    runs = run_dirs(workdir)
    assert len(runs) == 2
    bases = sorted(json.loads((r / "summary.json").read_text())["encoding"]["base"] for r in runs)
    assert bases == [100, 10000]
    [sweep] = sweep_dirs(workdir)
    # no experiment: named from what it sweeps; each job's directory from its own value
    assert sweep.name.endswith("_base-100,10000"), sweep.name
    assert sorted(r.name for r in runs) == ["0_base=100", "1_base=10000"]
    assert (sweep / "sweep.json").stat().st_mode & 0o777 == 0o644  # data, not a program
    meta = json.loads((sweep / "sweep.json").read_text())  # the command as typed; the name posenc gave it apart
    assert "name=" not in meta["command"] and "encoding.base=100,10000" in meta["command"], meta["command"]
    assert any(o.startswith("name=") for o in meta["overrides"]) and meta["name"] == "base-100,10000"
    # the end of the sweep says where it went and what to run next, verbatim
    rel = sweep.relative_to(workdir)
    assert f"sweep: {rel} (2 runs)" in result.stdout
    assert f"posenc compare {rel} --by encoding.base\n" in result.stdout
    # W&B's offline run log holds the run record: both jobs carry the sweep's group, which their
    # config names too (logger.group as used, not the null the sweep was given)
    for run in runs:
        wandb_run = offline_run(run)
        assert wandb_run["group"] == wandb_run["config"]["logger"]["group"] == sweep_group(sweep)

    for run in runs:  # each run says how busy the machine was when its timings were taken
        summary = json.loads((run / "summary.json").read_text())
        assert summary["machine/load_1m"] >= 0 and summary["machine/cpus"] >= 1

    # the printed next step, as printed, gives a verdict (here: why there is none, and how to get one)
    printed = next(line for line in result.stdout.splitlines() if line.startswith("compare them: "))
    result = run_cli(*shlex.split(printed.removeprefix("compare them: posenc ")), cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "verdict on val/ppl: none (1 seed per group" in result.stdout
    report = (sweep / "report.md").read_text()
    assert "| encoding.base | n (seeds) |" in report and "| 100 | 1 (0) |" in report and "| 10000 | 1 (0) |" in report and "1e4" not in report
    assert "ranking by val/ppl" in report


def test_every_job_of_a_sweep_shares_one_wandb_group_and_sweeps_differ():
    a = Path("outputs/sweeps/2025-01-01/10-00-00-000001_rope_bases")
    b = Path("outputs/sweeps/2025-01-01/10-00-00-000002_rope_bases")
    assert sweep_group(a) == "rope_bases-2025-01-01-10-00-00-000001"
    assert sweep_group(a) != sweep_group(b)


def compose_experiment(name: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="posenc.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[f"experiment={name}"], return_hydra_config=True)


def test_every_experiment_composes_names_its_sweep_and_sweeps_something():
    arms = {arm.experiment for arm in load_protocol().arms}  # posenc leaderboard's runs: one seed each, swept by it
    for name in group_options("experiment"):
        cfg = compose_experiment(name)
        assert cfg.name == name  # the sweep dir and W&B group carry it
        assert bool(cfg.hydra.sweeper.params) != (name in arms), name


def test_rope_bases_spans_10_to_1e6_log_spaced():
    params = compose_experiment("rope_bases").hydra.sweeper.params
    bases = [float(b) for b in params["encoding.base"].split(",")]
    assert bases[0] == 10 and bases[-1] == 1e6
    ratios = {round(b / a, 6) for a, b in zip(bases, bases[1:])}
    assert len(ratios) == 1 and ratios.pop() > 1  # a constant factor: evenly spaced on a log axis


def test_a_failed_job_does_not_stop_the_sweep_and_is_reported(workdir: Path):
    """Hydra's basic launcher runs the jobs in this process: each job's result (summary or
    failure) comes back to the CLI as its return value."""
    result = run_cli("train", "-m", *TINY, "trainer.max_steps=2", "model.attention=linear", "encoding=t5_bias,rope",
                     cwd=workdir)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of the sweep's 2 jobs failed: job 0 (") and "encoding=t5_bias" in last, last
    summaries = {r.name: json.loads((r / "summary.json").read_text()) for r in run_dirs(workdir)}
    assert summaries["0_encoding=t5_bias"]["status"] == "failed"
    assert "no score matrix" in summaries["0_encoding=t5_bias"]["error"]
    assert summaries["1_encoding=rope"]["status"] == "completed"


def test_sweep_and_job_names_carry_the_swept_values_and_are_filesystem_safe():
    assert sweep_name({"encoding": ["rope", "alibi"], "seed": [0, 1]}) == "encoding-rope,alibi_seed-0,1"
    assert sweep_name({"encoding.base": [10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0]}) == "base-10..1000000"
    assert sweep_name({}) == "sweep"
    fixed = ["model.n_layer", "name"]
    assert job_dir_name(["encoding=rope", "model.n_layer=1", "seed=0"], fixed, "rope") == "encoding=rope_seed=0"
    assert job_dir_name(["encoding.base=1e4", "name='x'"], fixed, "rope") == "base=10000"  # typed 1e4, shown 10000
    assert job_dir_name(["dataset.files=[a/b.txt]"], [], "rope") == "files=-a-b.txt"  # no '/' in a dir name
    assert job_dir_name(["model.n_layer=1"], fixed, "rope") == "rope"  # nothing swept: the encoding
    assert job_dir_name(["model.dropout=0.1", "encoding.dropout=0.2"], [], "x") == "model.dropout=0.1_encoding.dropout=0.2"
