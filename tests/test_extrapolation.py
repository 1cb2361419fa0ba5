"""Length extrapolation: the windows, chunked long evaluation, `posenc eval`, the plots."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from omegaconf.errors import ConfigAttributeError

from posenc.cli.explain import explain
from posenc.nn import dense as explicit_mask
from posenc.nn.encodings.alibi import ALiBi
from posenc.nn.encodings.learned import Learned
from posenc.nn.encodings.t5_bias import T5Bias
from posenc.config import compose
from posenc.eval.extrapolation import evaluate_extrapolation
from posenc.eval.loss import score_windows, sliding_windows
from posenc.nn.model import GPT
from posenc.eval.run import eval_run
from posenc.report.plots_length import extrapolation_groups, plot_extrapolation, rope_decay_bound
from posenc.train.loop import train

from conftest import TINY, run_cli, run_dirs


@pytest.mark.parametrize("length,stride", [(8, None), (8, 3), (8, 8), (16, 5), (64, 1)])
def test_windows_score_every_target_of_the_span_exactly_once(length, stride):
    span = 64
    scored = []
    for start, first in sliding_windows(span, length, stride):
        assert 0 <= start and start + length <= span
        scored += range(start + first, start + length)
        if stride is not None and first > 0:
            assert first >= length - stride  # every scored token sees >= length − stride context
    assert sorted(scored) == list(range(span))


@pytest.mark.parametrize("make", [lambda: ALiBi(32, 2), lambda: T5Bias(32, 2)])
def test_chunked_long_evaluation_equals_dense(make, monkeypatch):
    torch.manual_seed(0)
    model = GPT(vocab_size=64, encoding=make(), n_layer=1, n_head=2, d_model=32).eval()
    with torch.no_grad():  # T5 starts at zero bias: give it one so the test can fail
        for p in model.encoding.parameters():
            p.normal_()
    tokens = np.random.default_rng(0).integers(0, 64, 2000)

    def score():
        return score_windows(model, tokens, 256, 1024, batch_size=4, device=torch.device("cpu"))

    dense = score()
    monkeypatch.setattr(explicit_mask, "DENSE_MAX_LEN", 64)
    monkeypatch.setattr(explicit_mask, "QUERY_CHUNK", 48)
    chunked = score()
    assert (chunked.scored_tokens, chunked.windows) == (dense.scored_tokens, dense.windows)
    assert chunked.loss == pytest.approx(dense.loss, rel=1e-5)


def test_every_length_scores_the_same_tokens_and_learned_is_not_defined_beyond_max_len():
    torch.manual_seed(0)
    model = GPT(vocab_size=64, encoding=Learned(32, 2, max_len=32), n_layer=1, n_head=2, d_model=32)
    tokens = np.random.default_rng(0).integers(0, 64, 5000)
    results = evaluate_extrapolation(model, tokens, 16, [1, 2, 4], 1000, 256, torch.device("cpu"))
    assert [r.length for r in results] == [16, 32, 64]
    assert results[0].scored_tokens == results[1].scored_tokens == 960  # 1000 rounded to 64s
    assert results[1].ppl is not None
    assert results[2].ppl is None and "not defined" in results[2].reason


def test_perplexity_at_the_training_length_is_the_runs_validation_perplexity(tmp_path):
    """One evaluator: over the same validation tokens, the extrapolation at 1× and training's
    own val/ppl are the same number (batched differently: equal up to float rounding)."""
    seq_len, windows = 32, 2 * 4  # TINY: eval_batches × the global batch (batch_size, one process) validation windows
    cfg = compose([*TINY, "eval.at_end=true", "eval.lengths=[1]", f"eval.tokens={windows * seq_len}"], bench=False)
    summary = train(cfg, tmp_path)
    assert summary[f"extrapolation/ppl@{seq_len}"] == pytest.approx(summary["val/ppl"], rel=1e-5)
    assert summary["extrapolation"]["lengths"][0]["scored_tokens"] == windows * seq_len


def test_rope_decay_bound_decays_with_distance():
    """RoFormer §3.4.3: (1/(d/2)) Σ|S_j| is (d/2+1)/2 at distance 0 and falls with distance."""
    d = np.arange(0, 257)
    bound = rope_decay_bound(d, 128, 10000.0)
    assert bound[0] == pytest.approx(32.5)
    assert bound[200:].mean() < 0.5 * bound[1:20].mean()
    assert rope_decay_bound(d, 128, 500.0)[100:].mean() < bound[100:].mean()  # smaller base, faster decay


def test_posenc_eval_at_16x_and_plot(workdir, monkeypatch, capsys):
    """The 16× evaluation a run reports at its end is what `posenc eval` computes again; a scaling
    given to `posenc eval` changes it (and is recorded); learned has no perplexity past its table."""
    r = run_cli("train", "-m", *TINY, "eval.at_end=true", "encoding=rope,learned", "eval.lengths=[1,16]", cwd=workdir)
    assert r.returncode == 0, r.stderr[-2000:]
    rope_dir, learned_dir = sorted(run_dirs(workdir), key=lambda p: "learned" in p.name)
    summary = json.loads((rope_dir / "summary.json").read_text())
    at_16x = summary["extrapolation/ppl@512"]  # evaluated at the end of training, 16 × 32
    metrics = [json.loads(line) for line in (rope_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["extrapolation/ppl@512"] == at_16x
    record, _ = eval_run(rope_dir, [])  # in-process: the CLI's code path, the run's own settings
    assert record["extrapolation/ppl@512"] == pytest.approx(at_16x, rel=1e-6)
    assert record["complete"] is True and record["missing"] == []
    # training's per_position.png is this evaluation's: not computed again, not copied beside it
    assert (rope_dir / "per_position.json").exists() and not list(rope_dir.glob("per_position_eval*"))
    assert "per-position loss: training's per_position.png already holds it" in " ".join(capsys.readouterr().out.split())
    # eval.per_position=false: the perplexities alone
    record, _ = eval_run(rope_dir, ["eval.lengths=[1,2]", "eval.per_position=false"])
    assert record["complete"] is True and not list(rope_dir.glob("per_position_eval_lengths-1-2*"))

    r = run_cli("eval", str(rope_dir), "encoding.scaling=yarn", "encoding.scaling_factor=4", cwd=workdir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "512" in r.stdout and "yarn" in r.stdout  # the table
    # no terminal (a pipe): a line as each length starts and ends, not minutes of silence
    for what in ("per-position loss", "ppl"):
        assert f"{what} at length 512 (16×): started" in r.stdout
    assert re.search(r"ppl at length 512 \(16×\): ppl [\d.]+ over [\d,]+ windows  \(", r.stdout)
    record = json.loads(next(rope_dir.glob("eval_*yarn*.json")).read_text())
    assert record["encoding"]["scaling"] == "yarn"
    assert record["extrapolation/ppl@512"] != pytest.approx(at_16x, rel=1e-3)  # other frequencies, other ppl

    learned = json.loads((learned_dir / "summary.json").read_text())
    record, _ = eval_run(learned_dir, ["eval.lengths=[1,2]"])
    assert record["extrapolation/ppl@32"] == pytest.approx(learned["extrapolation/ppl@32"], rel=1e-6)
    assert record["extrapolation/ppl@64"] is None
    assert "not defined" in record["extrapolation"]["lengths"][1]["reason"]
    with pytest.raises(ConfigAttributeError) as refused:  # the schema's error; the CLI prints it as one line
        eval_run(rope_dir, ["encoding.scalng=yarn"])
    assert "unknown config key 'encoding.scalng'" in explain(refused.value)

    groups = extrapolation_groups([workdir / "outputs"])
    assert [g.label for g in groups] == ["learned", "rope"]
    png = plot_extrapolation(groups, workdir / "x.png")
    assert png.read_bytes()[:4] == b"\x89PNG"

    # eval.stride: two passes over overlapping windows, said before they run; the figure says so, and that
    # its band over overlapping windows understates the uncertainty
    import posenc.eval.per_position as per_position_module

    titles = []
    monkeypatch.setattr(per_position_module, "save_figure",
                        lambda fig, path: titles.append(fig.axes[0].get_title()) or path)
    eval_run(rope_dir, ["eval.lengths=[1]", "eval.stride=16"])
    out = " ".join(capsys.readouterr().out.split())
    assert "eval.stride=16: windows start every 16 tokens" in out and "in two passes" in out
    assert titles == ["rope: per-position loss, windows every 16 tokens (eval.stride)\n"
                      "overlapping windows (eval.stride): the band understates the uncertainty"]


def test_an_evaluation_that_scores_fewer_tokens_than_asked_says_so(tmp_path, caplog):
    """eval.tokens beyond what the validation split holds: the run scores what there is, and says
    how much it was asked for, in the log and in summary.json."""
    text = tmp_path / "corpus.txt"  # a small corpus: its whole validation split is scored in a moment
    text.write_text("".join(f"def f{i}(x):\n    return x * {i % 13} + {i % 7}  # line {i}\n" for i in range(3000)))
    cfg = compose([*TINY, "dataset=text", f"dataset.files=[{text}]", "eval.at_end=true", "eval.lengths=[1,4]",
                   "eval.tokens=100000000"], bench=False)
    with caplog.at_level("WARNING", logger="posenc"):
        summary = train(cfg, tmp_path)
    scored = {r["scored_tokens"] for r in summary["extrapolation"]["lengths"]}
    assert summary["extrapolation"]["tokens_asked"] == 100_000_000
    assert len(scored) == 1 and 0 < scored.pop() < 100_000_000
    assert "eval.tokens=100000000 asked" in caplog.text
