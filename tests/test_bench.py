"""`posenc bench` times the training step itself, and shows each row as soon as it is measured."""

from __future__ import annotations

import io
import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from conftest import TINY, run_cli
from rich.console import Console

from posenc.bench.run import Listener, bench
from posenc.bench.timing import build_subject, run_steps
from posenc.build import build_data
from posenc.cli.bench import run_bench, split_json_flag
from posenc.config import compose
from posenc.data.windows import RandomWindows
from posenc.errors import UserError
from posenc.record.rundir import load_checkpoint
from posenc.train.loop import train

BENCH = [*TINY, "model.flavor=gpt2", "bench.steps=1", "bench.rounds=1", "bench.warmup=1"]  # gpt2: the FLOPs formula below


def test_a_bench_step_changes_the_parameters_exactly_as_a_training_step(tmp_path: Path):
    # gradient accumulation, the LR warmup (lr/4 at the first step) and clipping all shape this
    # step: a benchmark that skipped any of them would end with other parameters
    overrides = [*TINY, "encoding=t5_bias", "trainer.max_steps=1", "trainer.grad_accum=2",
                 "trainer.warmup_steps=4", "trainer.grad_clip=0.01", "trainer.checkpoint_interval=1"]
    train(compose(overrides, bench=False), tmp_path)
    trained = load_checkpoint(tmp_path)["model"]

    cfg = compose(overrides)
    data = build_data(cfg)
    same_batches = RandomWindows(data.train, 32, 4, seed=cfg.seed)  # the windows training drew
    subject = build_subject("t5_bias", cfg, data.vocab_size, same_batches, torch.device("cpu"), nullcontext)
    initial = {k: v.clone() for k, v in subject.state.model.state_dict().items()}
    run_steps(subject, 1)  # what the bench times
    benched = subject.state.model.state_dict()

    assert benched.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(benched[name], value), name
    assert not all(torch.equal(initial[k], benched[k]) for k in initial)  # the step did change them


def flops_per_token(vocab: int, n_layer: int, d: int, seq_len: int) -> int:
    """PaLM appendix B, 6N + 12·L·d·T, with N counted from a GPT-2 block's shape: the tied
    embedding V·d; per layer 2 LayerNorms (4d), QKV (3d² + 3d), the output projection (d² + d)
    and the MLP (4d² + 4d, 4d² + d); the final LayerNorm (2d)."""
    n = vocab * d + n_layer * (12 * d * d + 13 * d) + 2 * d
    return 6 * n + 12 * n_layer * d * seq_len


def test_rows_appear_and_are_saved_as_measured_and_a_failing_encoding_leaves_its_reason(tmp_path: Path):
    out = tmp_path / "bench.json"
    names = {"reference", "nope", "learned", "rope"}
    printed: list[tuple[str, list[str]]] = []  # (a row's name, the names in the JSON file as it was printed)

    class Log(io.StringIO):  # not a terminal: one plain line per row
        def write(self, text: str) -> int:
            if text.split() and text.split()[0] in names:
                saved = json.loads(out.read_text())["results"] if out.exists() else []
                printed.append((text.split()[0], [r["name"] for r in saved]))
            return super().write(text)

    console = Console(file=Log(), width=300)
    # learned cannot encode position 16 of a 32-token window: its row fails, the others go on
    with pytest.raises(UserError, match="1 of 4 models failed: learned"):
        run_bench([*BENCH, "bench.encodings=[nope,learned,rope]", "encoding.max_len=16",
                   "bench.eval_length_multiple=2", "--json", str(out)], console, console)

    final = json.loads(out.read_text())["results"]
    rows = {r["name"]: r for r in final}
    assert set(rows) == names
    assert rows["learned"]["status"] == "failed" and "max_len=16" in rows["learned"]["error"]
    for name in ("reference", "nope", "rope"):
        assert rows[name]["status"] == "ok" and rows[name]["tokens_per_s"] > 0 and rows[name]["peak_mem_mb"] > 0
        assert rows[name]["flops_per_token"] == flops_per_token(256, 1, 32, 32)  # byte vocab, TINY's shape
        assert rows[name]["warmup_s"] > 0  # reported apart from the timed steps
    assert "max_len" not in rows["rope"]["options"]  # an encoding option reaches only the encodings that have it
    assert rows["rope"]["eval"]["length"] == 64 and rows["rope"]["eval"]["status"] == "ok"
    # every row was printed as soon as it was measured (the two baselines together, once both were:
    # they come from the same rounds), and was in the JSON file by then
    assert [name for name, _ in printed] == [r["name"] for r in final]
    for i, (name, saved) in enumerate(printed):
        assert saved == [r["name"] for r in final[: max(2, i + 1)]], name


@pytest.mark.parametrize("recipe", ["model.flavor=llama", "model.flavor=gpt2 model.norm=rmsnorm model.tie_embeddings=false"])
def test_the_reference_is_the_recipes_block_and_does_the_work_of_nope(recipe: str):
    """The price of the framework is measured at the same recipe: the plain reference takes the
    recipe's norm, MLP, biases and head (a llama posenc model against nanoGPT's GELU block would
    fold the recipe's cost into "vs reference"), and does what posenc's nope model does, the same
    6N + 12·L·d·T, its position table aside."""
    from posenc.bench.reference import REFERENCE
    from posenc.nn.flavors import swiglu_hidden

    cfg = compose([*TINY, *recipe.split()])
    data = build_data(cfg)
    batches = RandomWindows(data.train, 32, 4, seed=0)
    made = {name: build_subject(name, cfg, data.vocab_size, batches, torch.device("cpu"), nullcontext)
            for name in (REFERENCE, "nope")}
    reference, nope = (made[n].state.model for n in (REFERENCE, "nope"))
    assert made[REFERENCE].flops_per_token == made["nope"].flops_per_token
    matrices = lambda model: sorted(tuple(p.shape) for n, p in model.named_parameters()
                                    if p.dim() == 2 and not n.startswith(("wpe.", "encoding.")))
    # SwiGLU's W1 and W3 are one (d, 2h) matrix in posenc, two (d, h) in Llama's code
    h = swiglu_hidden(32)
    split = lambda shapes: sorted(s for a, b in shapes for s in ([(h, b)] * 2 if a == 2 * h else [(a, b)]))
    assert split(matrices(nope)) == matrices(reference)
    norm_types = lambda model: {type(m).__name__ for m in model.modules() if "Norm" in type(m).__name__}
    assert norm_types(reference) == norm_types(nope) == ({"RMSNorm"} if "llama" in recipe or "rmsnorm" in recipe
                                                         else {"LayerNorm"})
    biases = lambda model: any(n.endswith(".bias") for n, _ in model.named_parameters())
    assert biases(reference) == biases(nope) and (reference.lm_head.weight is reference.wte.weight) == \
        (nope.lm_head.weight is nope.wte.weight)


def test_json_on_stdout_and_rows_on_stderr(tmp_path: Path):
    result = run_cli("bench", *BENCH, "bench.encodings=[nope,rope]", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)  # stdout is pure JSON
    assert [r["name"] for r in out["results"]] == ["reference", "nope", "rope"]
    assert out["shape"] == {"n_layer": 1, "n_head": 2, "d_model": 32, "batch_size": 4, "seq_len": 32}
    lines = result.stderr.splitlines()
    assert any(line.startswith("posenc bench") and "recipe gpt2," in line for line in lines)  # what the reference is
    assert out["recipe"] == "gpt2"
    for name in ("reference", "nope", "rope"):
        assert any(line.startswith(f"{name} ") and "tokens/s" in line for line in lines), name
    # what it does, from its first line on (a loaded machine once showed only the header for 14 minutes)
    assert lines[0].startswith("posenc bench: loading torch")
    rounds = [line for line in lines if "timing rope (model 3 of 3): round" in line]
    assert rounds and rounds[0].startswith("[0:") and "round 1 of" in rounds[0], lines
    assert any("building nope (model 2 of 3)" in line for line in lines)


@pytest.mark.parametrize("choice", ["bench.encodings=[nope,rope]", "encoding=nope,rope"])
def test_bench_refuses_an_option_no_listed_encoding_has(choice):
    # the CLI prints it as one error: line
    with pytest.raises(UserError, match=r"bench.encodings=\['nope', 'rope'\] has the option 'encoding.num_buckets'"):
        bench([*TINY, choice, "encoding.num_buckets=8"])


def test_an_unknown_encoding_is_refused_before_anything_is_measured():
    with pytest.raises(UserError, match="unknown encoding 'ropee'"):
        bench([*TINY, "bench.encodings=[nope,ropee]"])


@pytest.mark.parametrize(("argv", "expected"), [
    (["model=base"], (["model=base"], None)),
    (["--json", "model=base"], (["model=base"], "-")),
    (["model=base", "--json"], (["model=base"], "-")),
    (["--json", "out.json", "model=base"], (["model=base"], "out.json")),
])
def test_json_goes_to_stdout_or_a_file(argv, expected):
    assert split_json_flag(argv) == expected


# --- a fake clock for the bench's timed rounds ----------------------------------------------------------
def fake_clock(monkeypatch, seconds) -> list[str]:
    """Replace the clock of every timed round: the steps still run (the models train as the bench
    trains them), and a round takes seconds(subject name, steps, calls so far) seconds. Returns the
    list of subjects timed, in order, as the rounds happen."""
    from posenc.bench import timing

    calls: list[str] = []

    def fake_round(subject, steps):
        calls.append(subject.name)
        timing.run_steps(subject, steps)
        return seconds(subject.name, steps, calls)

    monkeypatch.setattr(timing, "timed_round", fake_round)
    return calls


class Heard(Listener):
    """A bench listener that keeps the notes (the plan, the estimate) it hears."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def test_rounds_alternate_with_the_baselines_so_a_machine_busier_later_does_not_move_the_ratio(monkeypatch):
    # a fake clock: rope costs twice nope's step, the reference as much as nope, and the machine
    # becomes 3× slower for everything once rope is being measured (another job started)
    cost = {"reference": 1.0, "nope": 1.0, "rope": 2.0}
    calls = fake_clock(monkeypatch, lambda name, steps, calls: cost[name] * (3.0 if "rope" in calls else 1.0))
    result = bench([*TINY, "bench.steps=1", "bench.rounds=3", "bench.warmup=1", "bench.encodings=[nope,rope]"])
    # reference alone, then nope paired with the reference, then rope paired with both
    assert calls == ["reference"] * 3 + ["nope", "reference"] * 3 + ["rope", "reference", "nope"] * 3
    rows = {r["name"]: r for r in result["results"]}
    assert rows["rope"]["tokens_per_s"] < rows["nope"]["tokens_per_s"] / 5  # the absolute rate saw the load
    assert rows["rope"]["vs_nope"] == pytest.approx(0.5) and rows["rope"]["vs_reference"] == pytest.approx(0.5)
    assert rows["rope"]["vs_nope_range"] == pytest.approx([0.5, 0.5])
    assert rows["nope"]["vs_reference"] == pytest.approx(1.0) and rows["reference"]["vs_nope"] == pytest.approx(1.0)
    assert len(result["load"]) == 4  # the start, and after each of the three rows


def test_a_loaded_machine_is_named_in_one_warning(monkeypatch):
    from posenc.bench import run as bench_run
    from posenc.record.metrics import MACHINE_CPUS, MACHINE_LOAD

    monkeypatch.setattr(bench_run, "machine_load", lambda: {MACHINE_LOAD.name: 9.5, MACHINE_CPUS.name: 2})
    err = io.StringIO()
    run_bench([*BENCH, "bench.encodings=[nope]", "bench.reference=false"], Console(file=io.StringIO()),
              Console(file=err, width=300))
    warnings = [line for line in err.getvalue().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "9.5 on 2 CPUs" in warnings[0] and "paired" in warnings[0]


def test_a_ratio_shows_the_baselines_rate_in_the_same_rounds_so_the_row_is_self_consistent(monkeypatch):
    """Issue 36: alibi at 270 tokens/s beside nope's row at 1,100, yet 'vs nope 0.936×': nope's row
    was timed at another load. The ratio now names nope's rate in the paired rounds."""
    from posenc.bench import render

    cost = {"reference": 1.0, "nope": 1.0, "rope": 2.0}  # the machine 3× slower once rope is measured
    fake_clock(monkeypatch, lambda name, steps, calls: cost[name] * (3.0 if "rope" in calls else 1.0))
    result = bench([*TINY, "bench.steps=1", "bench.rounds=2", "bench.warmup=1", "bench.encodings=[nope,rope]"])
    rows = {r["name"]: r for r in result["results"]}
    rope, nope = rows["rope"], rows["nope"]
    assert rope["vs_nope_of"] == pytest.approx(rope["tokens_per_s"] / rope["vs_nope"])  # 0.5 of nope's rate then
    assert rope["vs_nope_of"] == pytest.approx(nope["tokens_per_s"] / 3)  # not nope's row: another load
    line = render.line(rope)
    assert f"vs nope 0.500× of {rope['vs_nope_of']:,.0f}" in line and "load " in line


def test_the_bench_says_how_long_it_will_take_after_its_first_rows(monkeypatch):
    fake_clock(monkeypatch, lambda name, steps, calls: 10.0 * steps)  # 10 s a step, whatever the model
    heard = Heard()
    notes = heard.notes
    result = bench([*TINY, "bench=quick", "bench.encodings=[nope,rope]"], heard)
    # quick: warm-up 1, 2 rounds of 3 steps, a memory step; reference 1+6+1, nope 1+6·2+1, rope 1+6·3+1 steps
    assert notes[0] == ("bench=quick: 3 models, 42 training steps; an estimate follows the first rows "
                        "(bench=default for the full bench)")
    # after the two baselines (their rows come together): rope's 20 steps
    assert notes[1].startswith("estimate: about 3 min left (bench=quick, 1 more model at ~10.00 s/step")
    # the full bench of the same encodings: warm-up 3, 3 rounds of 10 steps: 34 + 64 + 94 steps
    assert notes[1].endswith("the full bench (bench=default, 3 models): about 32 min") and result["estimate"] == notes[1]

    # a full bench whose timing the user set: bench=quick would run those same steps, so it is not offered
    notes.clear()
    bench([*TINY, "bench.steps=2", "bench.rounds=1", "bench.warmup=1", "bench.encodings=[nope,rope]"], heard)
    assert notes[1].startswith("estimate: about 1 min left (bench=default,") and "bench=quick" not in notes[1], notes


def test_the_bare_cpu_bench_is_a_representative_few_with_every_encoding_one_option_away(monkeypatch):
    """Issue 47: the bare `posenc bench` timed all 22 models on a CPU (over 30 minutes on 2 cores);
    it is a first look now, and says how to time every encoding."""
    from posenc.bench.plan import select_encodings
    from posenc.config import group_options

    fake_clock(monkeypatch, lambda name, steps, calls: 0.6 * steps)  # 0.6 s a step, whatever the model
    every = group_options("encoding")
    heard = Heard()
    notes = heard.notes
    result = bench([*TINY], heard)
    names = [r["name"] for r in result["results"]]
    assert names == ["reference", "nope", "sinusoidal", "rope", "alibi", "t5_bias", "fox"]
    assert notes[0].startswith(f"bench=quick (the CPU default): 7 models (6 of {len(every)} encodings, the preset's "
                               "list: encoding=all for every one), 122 training steps")
    full = round((34 + 64 + 94 * (len(every) - 1)) * 0.6 / 60)  # bench=default's steps: see the test above
    assert notes[1].endswith(f"the full bench (bench=default, {len(every) + 1} models): about {full} min")
    assert select_encodings(["encoding=all"])[0] == every == select_encodings(["bench=default"])[0]


def test_a_bench_without_nope_says_why_vs_nope_is_empty():
    from posenc.bench.run import NO_NOPE

    heard = Heard()
    result = bench([*BENCH, "bench.encodings=[alibi]", "bench.reference=false"], heard)
    assert result["results"][0]["vs_nope"] is None and NO_NOPE in heard.notes


def test_on_a_cpu_the_bare_bench_is_the_quick_one_and_a_choice_or_timing_override_is_kept():
    from posenc.bench.estimate import choose_preset

    assert choose_preset(["device=cpu"]) == (["bench=quick", "device=cpu"], "quick")
    assert choose_preset(["device=cpu", "bench=default"]) == (["device=cpu", "bench=default"], "default")
    assert choose_preset(["device=cpu", "bench.rounds=5"])[1] == "default"  # the full preset, as asked


def test_no_timed_round_contains_a_compilation(monkeypatch):
    """A round during which dynamo compiled (a baseline recompiling after another model was built,
    a backward graph compiled on first use) read 4-7x on an H200: such a round is taken again, and
    the row says how many were. Here nope's first round paired with rope compiles (10 s): the ratio
    is taken from clean rounds only."""
    from posenc.bench import timing

    cost, compiles = {"reference": 1.0, "nope": 1.0, "rope": 2.0}, [0]

    def seconds(name, steps, calls):
        if name == "nope" and calls.count("rope") == 1 and calls[-2] == "rope":
            compiles[0] += 1  # this round recompiled nope (as a guard failing after rope was built would)
            return 10.0
        return cost[name]

    calls = fake_clock(monkeypatch, seconds)
    monkeypatch.setattr(timing, "compilations", lambda: compiles[0])
    result = bench([*TINY, "bench.steps=1", "bench.rounds=2", "bench.warmup=1", "bench.encodings=[nope,rope]",
                    "bench.reference=false"])
    rows = {r["name"]: r for r in result["results"]}
    assert calls == ["nope"] * 2 + ["rope", "nope", "nope", "rope", "nope"]  # the compiling round taken again
    assert rows["rope"]["retimed"] == 1 and rows["nope"]["retimed"] == 0
    assert rows["rope"]["vs_nope_range"] == pytest.approx([0.5, 0.5])  # never 5.0, the compiling round's


def test_the_reference_and_nope_rows_agree_with_their_paired_ratio(monkeypatch):
    """Issue 47: the reference read 1,245 tokens/s and nope 3,527, yet nope was 1.581× the
    reference: the reference's own rounds, the bench's first, ran slower than every later one.
    Its row now takes its rounds alternating with nope's, the rounds the ratio is taken from."""
    cost = {"reference": 1.0, "nope": 0.8, "rope": 2.0}  # the process's first rounds (the reference alone) 3× slower
    fake_clock(monkeypatch, lambda name, steps, calls: cost[name] * (3.0 if "nope" not in calls else 1.0))
    result = bench([*TINY, "bench.steps=1", "bench.rounds=3", "bench.warmup=1", "bench.encodings=[nope,rope]"])
    rows = {r["name"]: r for r in result["results"]}
    reference, nope = rows["reference"], rows["nope"]
    assert nope["vs_reference"] == pytest.approx(1.25) and reference["vs_nope"] == pytest.approx(0.8)
    assert nope["tokens_per_s"] / reference["tokens_per_s"] == pytest.approx(nope["vs_reference"])
    assert reference["tokens_per_s"] == pytest.approx(nope["vs_reference_of"])  # one rate, whichever row says it
    assert reference["ms_per_step"] == pytest.approx(1000.0) and reference["timed_with"] == "nope"
    assert reference["timed_alone"]["ms_per_step"] == pytest.approx(3000.0)  # kept in the JSON, not the row


def test_ctrl_c_prints_the_rows_measured_so_far_saves_them_and_exits_as_an_interrupt(monkeypatch, tmp_path: Path):
    from typer.testing import CliRunner

    from posenc.bench import timing
    from posenc.cli.app import app

    def fake_round(subject, steps):  # the user presses Ctrl-C while rope is being timed
        if subject.name == "rope":
            raise KeyboardInterrupt
        timing.run_steps(subject, steps)
        return 1.0

    monkeypatch.setattr(timing, "timed_round", fake_round)
    out = tmp_path / "bench.json"
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["bench", *BENCH, "bench.encodings=[nope,rope,alibi]",
                                                            "--json", str(out)])
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1] == "interrupted: stopped by Ctrl-C"
    lines = result.stdout.splitlines()
    assert any(line.startswith("reference ") and "tokens/s" in line for line in lines)
    assert any(line.startswith("nope ") and "tokens/s" in line for line in lines)
    assert "interrupted after 2 of 4 models: the rows above are what was measured" in result.stdout
    saved = json.loads(out.read_text())
    assert saved["interrupted"] is True and [r["name"] for r in saved["results"]] == ["reference", "nope"]
