"""`posenc bench`: one table/JSON row per encoding plus the plain reference, same shape."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, run_cli
from posenc.bench.timing import bench
from posenc.cli.bench import split_json_flag
from posenc.errors import UserError

FIELDS = {"name", "params", "tokens_per_s", "ms_per_step", "mfu", "peak_mem_mb", "vs_nope", "vs_reference",
          "flops_per_token"}


def test_bench_times_each_encoding_against_nope_and_the_reference(tmp_path):
    result = run_cli("bench", *TINY, "model.flavor=gpt2",  # 6N with N = params: tied embeddings
                     "bench.encodings=[nope,learned,t5_bias]", "bench.steps=1",
                     "bench.rounds=2", "bench.warmup=1", "bench.peak_flops=1e12", "bench.eval_length_multiple=2",
                     "encoding.num_buckets=8", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)  # stdout is pure JSON; the table went to stderr
    assert "posenc bench" in result.stderr
    rows = {r["name"]: r for r in out["results"]}
    assert list(rows) == ["nope", "learned", "t5_bias", "reference"]
    assert out["shape"] == {"n_layer": 1, "n_head": 2, "d_model": 32, "batch_size": 4, "seq_len": 32}
    for r in rows.values():
        assert FIELDS <= r.keys()
        assert r["tokens_per_s"] == pytest.approx(4 * 32 / (r["ms_per_step"] / 1e3))
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e12)
        assert r["peak_mem_mb"] > 0 and len(r["ms_per_step_rounds"]) == 2
        assert r["vs_reference"] == pytest.approx(r["tokens_per_s"] / rows["reference"]["tokens_per_s"])
    assert rows["nope"]["vs_nope"] == 1.0 and rows["reference"]["vs_reference"] == 1.0
    # PaLM appendix B: 6N + 12·L·d·T FLOPs per token (N: every matmul parameter; nope has only those)
    assert rows["nope"]["flops_per_token"] == 6 * rows["nope"]["params"] + 12 * 1 * 32 * 32
    # an encoding option reaches the encodings that have it, and only those
    assert rows["t5_bias"]["options"]["num_buckets"] == 8 and rows["nope"]["options"] == {}
    # 2x the training length: learned refuses it, the others run it
    assert rows["learned"]["eval"]["status"] == "beyond max_len"
    assert rows["t5_bias"]["eval"] == pytest.approx({"length": 64, "status": "ok", "seconds": rows["t5_bias"]["eval"]["seconds"]})


@pytest.mark.parametrize("choice", ["bench.encodings=[nope,rope]", "encoding=nope,rope"])
def test_bench_refuses_an_option_no_listed_encoding_has(choice):
    # the CLI prints it as one error: line
    with pytest.raises(UserError, match=r"bench.encodings=\['nope', 'rope'\] has the option 'encoding.num_buckets'"):
        bench([*TINY, choice, "encoding.num_buckets=8"])


@pytest.mark.parametrize(("argv", "expected"), [
    (["model=base"], (["model=base"], None)),
    (["--json", "model=base"], (["model=base"], "-")),
    (["model=base", "--json"], (["model=base"], "-")),
    (["--json", "out.json", "model=base"], (["model=base"], "out.json")),
])
def test_json_goes_to_stdout_or_a_file(argv, expected):
    assert split_json_flag(argv) == expected
