"""`posenc leaderboard`: the shipped baselines are data that match the current protocol, a new row is
placed with compare's own statistics, a protocol-changing override or stale data is refused with one
line and nothing written, the leaderboard page is what the data renders, and the whole command runs
end to end on a tiny protocol given as a file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from broken_encodings import IMPORTS, WINDOW_LENGTH

from posenc.check import check_version
from posenc.config.searchpath import ENV_VAR
from posenc.leaderboard.data import Row, baselines_path, load_baselines
from posenc.leaderboard.eta import Clock, Pace
from posenc.leaderboard.match import (
    DIFFERENT,
    DRAW,
    EXACT,
    WITHIN,
    match,
    overall,
    seed_verdict,
)
from posenc.leaderboard.page import render
from posenc.leaderboard.place import place
from posenc.leaderboard.protocol import (
    DEFAULT_PROTOCOL,
    as_recorded,
    load_protocol,
    protocol_hash,
    resolved,
)
from posenc.report.runs import find_runs, group_runs
from posenc.report.verdicts import ranking_of, versus_baseline

ROOT = Path(__file__).resolve().parents[1]
PPL, ACC = "extrapolation/ppl@1024", "tasks/flip_flop/accuracy@128"


# --- placing a row: compare's code on the same numbers ------------------------------------------
def write_run(root: Path, label: str, seed: int, summary: dict) -> None:
    """A run directory as `posenc train` leaves one, as far as `posenc compare` reads it."""
    run = root / f"{label}_{seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "encoding": {"name": label}}))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"encoding={label}", f"seed={seed}"]))
    (run / "summary.json").write_text(json.dumps(summary))


SHIPPED = [Row("rope", {PPL: [10.1, 12.3, 9.6], ACC: [0.40, 0.35, 0.45]}),
           Row("alibi", {PPL: [9.1, 9.2, 9.0], ACC: [0.80, 0.78, 0.75]}),
           Row("learned", {PPL: [None, None, None], ACC: [None, None, None]}),
           Row("nope", {PPL: [10.2, 10.1, 10.0], ACC: [0.30, 0.33, 0.31]})]
MINE = Row("mine", {PPL: [9.5, 9.7, 9.4], ACC: [0.60, 0.62, 0.58]})


def test_a_placed_row_gets_the_intervals_ranks_and_verdicts_compare_gives_the_same_numbers(tmp_path):
    for row in [*SHIPPED, MINE]:
        for i, seed in enumerate((0, 1, 2)):
            write_run(tmp_path, row.label, seed, {m: v[i] for m, v in row.values.items()})
    groups = group_runs(find_runs([tmp_path]), ["encoding"])
    by_label = {g.label: g for g in groups}
    for p in place(SHIPPED, MINE, [PPL, ACC], (0, 1, 2)):
        assert p.stats == {label: g.stat(p.metric) for label, g in by_label.items()}
        assert p.ranking == ranking_of(groups, p.metric)
        assert p.versus == {label: versus_baseline(by_label["mine"], g, p.metric)
                            for label, g in by_label.items() if label != "mine"}
    [ppl, acc] = place(SHIPPED, MINE, [PPL, ACC], (0, 1, 2))
    assert [r.label for r in ppl.ranking.ranks] == ["alibi", "mine", "nope", "rope"]
    assert ppl.ranking.unranked == ["learned"]          # no value past its table: not ranked, not invented
    assert acc.versus["nope"].verdict == "better" and acc.versus["alibi"].verdict == "worse"


def test_a_new_row_named_like_a_shipped_one_replaces_it():
    rerun = Row("rope", {PPL: [9.0, 9.1, 9.2], ACC: [0.5, 0.5, 0.5]})
    [p] = place(SHIPPED, rerun, [PPL], (0, 1, 2))
    assert p.stats["rope"].values == (9.0, 9.1, 9.2) and "rope" not in p.versus


# --- reproducing a row ----------------------------------------------------------------------------
def test_a_rerun_matches_exactly_within_tolerance_or_not():
    protocol = load_protocol("posenc-pe-v1")  # every value seed by seed: a relative 1e-3, one instance in 128
    assert seed_verdict(8.862, 8.862, PPL, protocol) == EXACT
    assert seed_verdict(8.862, 8.862 * (1 + 5e-4), PPL, protocol) == WITHIN
    assert seed_verdict(8.862, 8.97, PPL, protocol) == DIFFERENT
    assert seed_verdict(0.5, 0.5 + 1 / 128, ACC, protocol) == WITHIN          # one instance in 128
    assert seed_verdict(0.5, 0.5 + 2 / 128, ACC, protocol) == DIFFERENT
    assert seed_verdict(None, None, PPL, protocol) == EXACT                   # no such positions, both times
    assert seed_verdict(None, 3.0, PPL, protocol) == DIFFERENT
    shipped = Row("rope", {m: [1.0, 2.0, 3.0] for m in protocol.metrics})
    assert overall(match(shipped, shipped, protocol)) == EXACT
    off = Row("rope", {m: [1.0, 2.0, 3.5] for m in protocol.metrics})
    assert overall(match(shipped, off, protocol)) == DIFFERENT


def test_on_another_cpu_a_flip_flop_seed_is_a_draw_and_its_mean_is_judged():
    """Issue 47: on an Intel Xeon 7 of rope's 9 flip-flop values were not the AMD EPYC's (0.906 ->
    0.961), while every perplexity agreed to 3e-7. posenc-pe-v2 holds perplexities seed by seed to
    a relative 1e-5, and each flip-flop accuracy on its mean over the seeds, to the spread measured
    between CPUs; these are the issue's and this session's values (docs/leaderboard.md)."""
    protocol = load_protocol("posenc-pe-v2")
    epyc = {PPL: [12.343586609189703, 9.793458647014049, 9.851665937505587], ACC: [0.609375, 0.4609375, 0.5078125]}
    xeon = {PPL: [12.343586609189703, 9.793460981956823, 9.851668286326062], ACC: [0.6328125, 0.4296875, 0.5703125]}
    matches = {(m.metric, m.seed): m for m in match(Row("rope", epyc), Row("rope", xeon), protocol)
               if m.metric in (PPL, ACC)}
    assert matches[(PPL, 0)].verdict == EXACT and matches[(PPL, 1)].verdict == WITHIN
    assert all(matches[(ACC, seed)].verdict == DRAW for seed in (0, 1, 2))
    mean = matches[(ACC, None)]
    assert mean.shipped == pytest.approx(0.5260417) and mean.rerun == pytest.approx(0.5442708)
    assert mean.verdict == WITHIN
    assert protocol.tolerance_of(ACC).value < 0.15  # still catches a real change of a row's mean
    broken = {**xeon, ACC: [0.30, 0.25, 0.28]}
    assert overall(match(Row("rope", epyc), Row("rope", broken), protocol)) == DIFFERENT
    assert seed_verdict(9.8, 9.8 * (1 + 1e-4), PPL, protocol) == DIFFERENT  # a perplexity is held tightly


# --- refusals: one line, nothing written --------------------------------------------------------------
def leaderboard_cli(*args: str, command: str = "leaderboard"):
    """`posenc leaderboard ARGS` in this process (the caller's cwd is a tmp dir): (exit code, stderr)."""
    from typer.testing import CliRunner

    from posenc.cli.app import app

    result = CliRunner().invoke(app, [command, *args])
    return result.exit_code, result.stderr


def test_bare_leaderboard_prints_the_shipped_table_and_how_to_place_ones_own(workdir):
    """Nothing to run: the shipped rows as the page's main table, in the terminal, every row and
    metric (or the one --metric names, by its key, its column or its multiple), and the command that
    places one's own encoding; nothing written, and no torch imported to say it."""
    import subprocess
    import sys

    from typer.testing import CliRunner

    from posenc.cli.app import app

    protocol = load_protocol(DEFAULT_PROTOCOL)
    baselines = load_baselines(protocol)
    result = CliRunner().invoke(app, ["leaderboard"])
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())
    for row in baselines.rows:
        assert f"│ {row.label} " in result.stdout
    assert all(label in out for label in protocol.metrics.values())
    assert "place your own encoding among them: `posenc leaderboard encoding=mine`" in out
    assert {protocol.metric_named(name) for name in ("extrapolation/ppl@1024", "ppl 16×", "PPL 16x",
                                                      "extrapolation/ppl@16x")} == {"extrapolation/ppl@1024"}
    one = [CliRunner().invoke(app, ["leaderboard", "--metric", "extrapolation/ppl@16x"]).stdout]
    assert "ppl 16×" in one[0] and "ppl 1×" not in one[0]
    # sorted by that metric: the shipped ranking on it, best first
    from posenc.leaderboard.place import ranking_only

    ranks = [r.label for r in ranking_only(baselines.rows, "extrapolation/ppl@1024", protocol.seeds)[1].ranks]
    shown = [line.split("│")[1].strip().rstrip(" *") for line in one[0].splitlines()
             if line.startswith("│ ") and line.split("│")[1].strip()]
    assert shown[: len(ranks)] == ranks
    code, stderr = leaderboard_cli("--metric", "ppl@16")
    assert code == 1 and "--metric 'ppl@16' is not one of posenc-pe-v2's metrics" in stderr
    code, stderr = leaderboard_cli("--metric", "ppl 16×", "encoding=rope")
    assert code == 1 and "give it alone" in stderr
    assert not (workdir / "outputs").exists()
    probe = ("import sys\nfrom posenc.cli.app import app\ntry:\n    app(['leaderboard'])\nexcept SystemExit:\n    pass\n"
             "print('TORCH', 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=workdir)
    assert "TORCH False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("args", [["encoding=rope", "trainer.max_steps=5"], ["encoding=rope", "model=tiny"],
                                  ["encoding=rope,alibi"], ["--regenerate", "encoding=rope"]])
def test_an_override_that_changes_the_protocol_is_refused(workdir, args):
    code, stderr = leaderboard_cli(*args)
    assert code == 1
    assert stderr.startswith("error:") and len(stderr.strip().splitlines()) == 1, stderr
    assert not (workdir / "outputs").exists()


def test_baselines_from_another_protocol_are_refused(workdir):
    """The shipped data's hash differs from the protocol's (a default it inherits changed): refused."""
    protocol = workdir / "p.yaml"
    protocol.write_text((ROOT / "posenc" / "leaderboard" / "posenc-pe-v1.yaml").read_text())
    (workdir / "p.json").write_text(json.dumps({"protocol": {"name": "posenc-pe-v1", "hash": "0" * 16},
                                                 "versions": {"posenc": "0.0.1"}, "rows": {}}))
    code, stderr = leaderboard_cli("encoding=rope", "--protocol", str(protocol))
    assert code == 1
    assert stderr.startswith("error:") and len(stderr.strip().splitlines()) == 1, stderr
    assert "protocol hash 0000000000000000" in stderr and "--regenerate" in stderr
    assert not (workdir / "outputs").exists()


# --- the shipped data -------------------------------------------------------------------------------
SHIPPED_PROTOCOLS = ["posenc-pe-v2", "posenc-pe-v1"]  # the default, and its earlier version kept readable


@pytest.fixture(scope="module", params=SHIPPED_PROTOCOLS)
def shipped(request):
    protocol = load_protocol(request.param)
    return protocol, load_baselines(protocol)


def test_the_shipped_baselines_have_every_shipped_encoding_and_every_seed(shipped):
    from posenc.config import group_options

    protocol, baselines = shipped
    assert baselines_path(protocol).stat().st_size < 200_000
    assert sorted(r.label for r in baselines.rows) == group_options("encoding")
    for row in baselines.rows:
        assert not row.errors, (row.label, row.errors)
        assert {m: len(v) for m, v in row.values.items()} == {m: len(protocol.seeds) for m in protocol.metrics}
        assert any(v is not None for values in row.values.values() for v in values)
    raw = baselines.raw
    assert raw["versions"]["torch"] and raw["versions"]["posenc"] and raw["machine"]["cpu"] and raw["date"]
    assert raw["command"].startswith(("posenc leaderboard --regenerate", "posenc benchmark --regenerate"))  # the old name measured them
    # every row says what `posenc check` found of its encoding, and under which version of the checks
    assert all(row.check is not None and len(row.check["version"]) == 8 for row in baselines.rows)


def test_the_shipped_baselines_were_measured_under_the_current_protocol(shipped):
    """A change to anything the protocol composes (the micro model, the trainer's or the evaluator's
    defaults, the corpus settings) without regenerating the data fails here."""
    protocol, baselines = shipped
    recorded = baselines.raw["protocol"]["config"]
    current, added = as_recorded(json.loads(json.dumps(resolved(protocol), default=str)), recorded)
    assert baselines.hash == protocol_hash(current)
    assert recorded == current, f"keys added since the data was measured: {added}"


def test_a_key_posenc_gains_later_is_not_the_protocol_but_a_changed_value_is():
    recorded = {"arms": {"lm": {"config": {"trainer": {"lr": 0.002, "max_steps": 100}}}}}
    grown = {"arms": {"lm": {"config": {"trainer": {"lr": 0.002, "max_steps": 100, "allow_code_change": False}}}}}
    changed = {"arms": {"lm": {"config": {"trainer": {"lr": 0.003, "max_steps": 100}}}}}
    cut, added = as_recorded(grown, recorded)
    assert protocol_hash(cut) == protocol_hash(recorded) and added == ["arms.lm.config.trainer.allow_code_change"]
    assert protocol_hash(as_recorded(changed, recorded)[0]) != protocol_hash(recorded)


def test_the_leaderboard_page_is_what_the_shipped_data_renders(shipped):
    from posenc.cli.leaderboard_command import leaderboard_path

    protocol, baselines = shipped
    assert leaderboard_path(protocol.name).read_text() == render(baselines, protocol)


def test_v2_carries_v1s_rows_because_it_runs_the_same_arms_and_seeds():
    """posenc-pe-v2 changed how a re-run is judged, not what runs: its rows are v1's, measured once."""
    v1, v2 = (load_baselines(load_protocol(name)) for name in ("posenc-pe-v1", "posenc-pe-v2"))
    assert {r.label: r.values for r in v2.rows} == {r.label: r.values for r in v1.rows}
    assert v2.raw["carried_from"]["protocol"] == "posenc-pe-v1" and v2.raw["carried_from"]["hash"] == v1.hash
    assert v2.raw["protocol"]["config"]["arms"] == v1.raw["protocol"]["config"]["arms"]
    assert v2.raw["machine"] == v1.raw["machine"] and v2.hash != v1.hash  # the tolerance is hashed


# --- end to end on a tiny protocol given as a file ----------------------------------------------------
TINY_PROTOCOL = {
    "name": "tiny-test", "description": "flip-flop on a 1-layer d=32 model, 3 steps, 1 seed: the test's protocol",
    "seeds": [0], "encodings": ["alibi", "nope"],
    "arms": {"flip_flop": {
        "experiment": "pe_v1_flip_flop",
        "overrides": ["model.n_layer=1", "model.d_model=32", "trainer.max_steps=3", "trainer.batch_size=4",
                      "trainer.warmup_steps=1", "trainer.eval_interval=3", "trainer.log_interval=1",
                      "dataset.eval_instances=8", "dataset.eval_multiples=[1,2]"],
        "metrics": {"tasks/flip_flop/accuracy@32": "flip-flop 1×", "tasks/flip_flop/accuracy@64": "flip-flop 2×"}}},
    "tolerance": {"relative": 1e-3, "absolute": 0.008},
}


@pytest.mark.slow  # the leaderboard's protocol, trained and placed end to end
def test_regenerate_place_and_reproduce_on_a_tiny_protocol(workdir: Path):
    from typer.testing import CliRunner

    from posenc.cli.app import app

    path = workdir / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_PROTOCOL, allow_unicode=True))
    runner = CliRunner()
    regenerated = runner.invoke(app, ["leaderboard", "--regenerate", "--protocol", str(path)])
    assert regenerated.exit_code == 0, regenerated.output
    protocol = load_protocol(str(path))
    baselines = load_baselines(protocol)
    assert [r.label for r in baselines.rows] == ["alibi", "nope"]
    assert path.with_suffix(".md").read_text() == render(baselines, protocol)

    assert all(row.check == {"version": check_version(), "failed": []} for row in baselines.rows)

    placed = runner.invoke(app, ["leaderboard", "encoding=rope", "encoding.base=500", "--protocol", str(path)])
    assert placed.exit_code == 0, placed.output
    # one ETA for the whole placement, from a run of each arm timed here, and what it took against it
    assert re.search(r"1 run: about 0:00:\d\d here \(a run of each arm timed on this machine now: flip_flop \d+ ms/step "
                     r"× 3 steps \+ [\d.]+ s to build and evaluate\)", placed.output), placed.output
    assert re.search(r"1 run took 0:00:\d\d \(estimated 0:00:\d\d before they ran\)", placed.output), placed.output
    assert "▶ rope base=500" in placed.output and "rope base=500 against each shipped row" in placed.output
    assert next(line for line in placed.output.splitlines() if "▶ rope base=500" in line).rstrip(" │").endswith("✓")
    [saved] = (workdir / "outputs" / "leaderboard" / "tiny-test").rglob("*_rope_base=500/benchmark.json")
    assert json.loads(saved.read_text())["hash"] == baselines.hash
    assert len(list(saved.parent.rglob("summary.json"))) == 1      # one run per seed, as `posenc train -m` leaves

    reproduced = runner.invoke(app, ["leaderboard", "--reproduce", "nope", "--protocol", str(path)])
    assert reproduced.exit_code == 0, reproduced.output
    assert "reproduced: every value of nope equals the shipped one exactly" in reproduced.output

    # a version that judges re-runs otherwise but runs the same arms keeps the rows; one that runs
    # other arms is refused, nothing written
    judged = {m: {"absolute": 0.2, "over": "mean"} for m in TINY_PROTOCOL["arms"]["flip_flop"]["metrics"]}
    v2 = workdir / "tiny2.yaml"
    v2.write_text(yaml.safe_dump({**TINY_PROTOCOL, "name": "tiny-test-v2", "tolerance": {"metrics": judged}},
                                 allow_unicode=True))
    carried = runner.invoke(app, ["leaderboard", "--regenerate", "--carry-from", str(path), "--protocol", str(v2)])
    assert carried.exit_code == 0, carried.output
    rows = load_baselines(load_protocol(str(v2)))
    assert [(r.label, r.values) for r in rows.rows] == [(r.label, r.values) for r in baselines.rows]
    assert rows.raw["carried_from"]["hash"] == baselines.hash and "carried over from `tiny-test`" in \
        v2.with_suffix(".md").read_text()
    again = runner.invoke(app, ["leaderboard", "--reproduce", "alibi", "--protocol", str(v2)])
    assert again.exit_code == 0 and "equals the shipped one exactly" in again.output, again.output
    assert "mean" in again.output and "a draw" in again.output  # each seed shown, the mean judged
    other = {**TINY_PROTOCOL, "name": "tiny-test-v3", "arms": {"flip_flop": {
        **TINY_PROTOCOL["arms"]["flip_flop"],
        "overrides": [*TINY_PROTOCOL["arms"]["flip_flop"]["overrides"], "trainer.lr=1e-3"]}}}
    v3 = workdir / "tiny3.yaml"
    v3.write_text(yaml.safe_dump(other, allow_unicode=True))
    refused = runner.invoke(app, ["leaderboard", "--regenerate", "--carry-from", str(path), "--protocol", str(v3)])
    assert refused.exit_code == 1 and "measured with another arms.flip_flop." in refused.stderr, refused.output
    assert not v3.with_suffix(".json").exists()


PLUGIN = IMPORTS + WINDOW_LENGTH  # a bias that reads the window's length (tests/broken_encodings.py)


def test_an_encoding_that_fails_check_is_refused_before_any_run(workdir: Path, monkeypatch):
    """A bias that reads the window's length (the prefix row fails) would have been ranked among the
    shipped rows: `posenc leaderboard` runs `posenc check` first and refuses it in one line, naming
    what fails, with nothing written."""
    from typer.testing import CliRunner

    from posenc.cli.app import app

    (workdir / "lengthplug.py").write_text(PLUGIN)
    (workdir / "conf" / "encoding").mkdir(parents=True)
    (workdir / "conf" / "encoding" / "window_length.yaml").write_text("_target_: lengthplug.WindowLength\n")
    monkeypatch.syspath_prepend(str(workdir))
    monkeypatch.setenv(ENV_VAR, str(workdir / "conf"))
    result = CliRunner().invoke(app, ["leaderboard", "encoding=window_length"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: window_length fails `posenc check` (prefix: first t tokens = them alone;")
    assert len(result.stderr.strip().splitlines()) == 1 and "--despite-check" in result.stderr
    assert not (workdir / "outputs").exists()


def test_a_config_dir_cannot_change_the_protocol(tmp_path, monkeypatch):
    """--config-dir (POSENC_CONFIG_PATH) adds encodings and never shadows posenc's own files: a file
    there named like an arm's experiment changes nothing the protocol composes."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "pe_v1_lm.yaml").write_text("# @package _global_\ntrainer:\n  max_steps: 5\n")
    protocol = load_protocol()
    before = protocol_hash(resolved(protocol))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert protocol_hash(resolved(protocol)) == before



def test_a_difference_another_cpu_could_make_is_no_verdict_in_a_placement():
    """The shipped rows were measured on another CPU: a flip-flop difference Welch's test detects
    across seeds, but within how far a CPU moves the mean (the protocol's tolerance), reads ≈ CPU."""
    import io

    from rich.console import Console

    from posenc.cli.leaderboard_place import versus_table

    protocol = load_protocol("posenc-pe-v2")
    tolerance = protocol.tolerance_of(ACC).value
    shipped = [Row("rope", {PPL: [10.0, 10.1, 10.2], ACC: [0.40, 0.41, 0.40]}),
               Row("alibi", {PPL: [9.0, 9.1, 9.2], ACC: [0.20, 0.21, 0.20]})]
    near = 0.40 + tolerance / 2  # detectable (the seeds agree to 0.01) yet inside the CPU spread
    mine = Row("mine", {PPL: [9.5, 9.6, 9.7], ACC: [near, near + 0.01, near]})
    placements = place(shipped, mine, [PPL, ACC], (0, 1, 2))
    out = io.StringIO()
    Console(file=out, width=400).print(versus_table(placements, protocol, "mine"))
    rows = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") > 2}
    assert "≈ CPU" in rows["rope"].split("│")[3] and "better" in rows["alibi"].split("│")[3]
    assert placements[1].versus["rope"].verdict == "better"  # Welch alone would call it


def test_the_old_command_name_is_an_alias_for_a_release(workdir):
    """`posenc benchmark` (the command's name beside `posenc bench` until this release) still runs
    `posenc leaderboard`, with the same refusals, and is hidden from the command list."""
    from typer.testing import CliRunner

    from posenc.cli.app import app

    old, new = leaderboard_cli("encoding=rope", "model=tiny", command="benchmark"), leaderboard_cli("encoding=rope", "model=tiny")
    assert old[0] == new[0] == 1
    assert old[1] == "warning: `posenc benchmark` is now `posenc leaderboard`; the old name goes in a later release\n" + new[1]
    listed = CliRunner().invoke(app, ["--help"]).stdout
    commands = {line.split()[1] for line in listed.splitlines() if line.startswith("│ ") and len(line.split()) > 1}
    assert "leaderboard" in commands and "benchmark" not in commands
    assert not list(workdir.iterdir())


def test_the_placements_eta_is_each_arms_measured_run_rescaled_by_what_the_finished_arms_took():
    """The shipped rows' times came from a loaded machine; the estimate is this machine's measured pace
    (posenc/leaderboard/eta.py), and once an arm has run, the arms left are scaled as it was."""
    lm = Pace("lm", setup_s=1.0, step_s=0.05, steps=100, validation_s=0.5, validations=2, evaluation_s=2.0)
    flip = Pace("flip_flop", setup_s=1.0, step_s=0.02, steps=200, validation_s=0.0, validations=1, evaluation_s=1.0)
    clock = Clock([lm, flip], seeds=3)
    assert lm.run_s == pytest.approx(1.0 + 5.0 + 1.0 + 2.0) and clock.total == pytest.approx(3 * 9.0 + 3 * 6.0)
    assert clock.left() == pytest.approx(clock.total)
    clock.arm_done("lm", 2 * 27.0)  # the machine got twice as busy
    assert clock.left() == pytest.approx(2 * 18.0)
    assert clock.progress() == "ETA 0:00:36 for the rest (lm took 0:00:54, estimated 0:00:27)"
