"""Every command carries `posenc check`'s verdict (posenc/check/verdict.py): a run of an encoding that
fails says so once and records it, the verdict is measured once per key — the code on the check's
whole path, the encoding's, its configs, the precision, the libraries — and found again by it,
measuring it changes nothing about the run, `compare` marks the arm, and the verdicts posenc ships
are what today's code measures (every entry measured again here), every shipped encoding and layout
passing."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path

import pytest
from broken_encodings import IMPORTS, TRAINING_LEAK
from conftest import TINY, cli_env, run_cli

from posenc.check import identity as I
from posenc.check import verdict as V
from posenc.check.shipped import PRECISIONS, entries, label, measured, shipped_path
from posenc.check.subject import check_length
from posenc.config import compose
from posenc.config.searchpath import CONFIG_MODULE, ENV_VAR

WARNING = "warning: encoding 'training_leak' fails posenc check"
CAUSAL = "causal: the future reaches no past logit"


@pytest.fixture(scope="module")
def leak(tmp_path_factory) -> Path:
    """A plug-in directory holding an encoding that leaks the future in training only."""
    root = tmp_path_factory.mktemp("leak")
    (root / "leakplug.py").write_text(IMPORTS + TRAINING_LEAK)
    (root / "conf" / "encoding").mkdir(parents=True)
    (root / "conf" / "encoding" / "training_leak.yaml").write_text(
        "# leaks the future in training (tests/broken_encodings.py)\n_target_: leakplug.TrainingLeak\nname: training_leak\n")
    return root


@pytest.fixture(scope="module")
def runs(leak, tmp_path_factory) -> dict:
    """Three runs of the leaking encoding, each a process of its own sharing one verdict cache (the first
    measures; the second finds it; the third says check=false), and a run of RoPE (its verdict shipped)."""
    cwd, cache = tmp_path_factory.mktemp("runs"), tmp_path_factory.mktemp("cache")
    env = {**cli_env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(leak), os.environ.get("PYTHONPATH")])),
           V.CACHE_ENV: str(cache)}
    env.pop(ENV_VAR, None)
    out = {"cwd": cwd, "cache": cache}
    at_lengths = ["eval.at_end=true", "eval.lengths=[1,2]"]  # for `posenc plot extrapolation`
    for name, extra in (("first", at_lengths), ("second", []), ("off", ["check=false"])):
        out[name] = run_cli("train", "--config-dir", str(leak / "conf"), "encoding=training_leak", *TINY, *extra,
                            f"hydra.run.dir={name}", cwd=cwd, env=env)
        assert out[name].returncode == 0, out[name].stderr[-3000:]
    out["rope"] = run_cli("train", "encoding=rope", *TINY, *at_lengths, "hydra.run.dir=rope", cwd=cwd, env=env)
    return out


def summary(runs: dict, name: str) -> dict:
    return json.loads((runs["cwd"] / name / "summary.json").read_text())


def test_a_run_of_an_encoding_that_fails_check_warns_once_and_records_the_verdict(runs):
    lines = [line for line in runs["first"].stderr.splitlines() if line.startswith(WARNING)]
    assert len(lines) == 1 and CAUSAL in lines[0], runs["first"].stderr[-2000:]
    check = summary(runs, "first")["check"]
    assert check["holds"] is False and check["from"] == "measured" and CAUSAL in check["failed"]
    assert summary(runs, "first")["check/failed"] == "; ".join(check["failed"])  # W&B's summary takes it as one string
    rope = summary(runs, "rope")["check"]
    assert rope["holds"] is True and rope["from"] == "shipped" and WARNING[:20] not in runs["rope"].stderr


def test_the_verdict_is_measured_once_per_code_version_and_measuring_changes_nothing(runs):
    """The second run finds the first's verdict under the same key (a file of the cache), warns as the
    first did, and trains the same model to the same loss: measuring restored everything it drew."""
    first, second = summary(runs, "first"), summary(runs, "second")
    assert second["check"]["from"] == "cache" and second["check"]["key"] == first["check"]["key"]
    assert [p.name for p in runs["cache"].glob("*.json")] == [f"{first['check']['key']}.json"]
    assert sum(line.startswith(WARNING) for line in runs["second"].stderr.splitlines()) == 1
    assert second["val/loss"] == first["val/loss"]


def test_check_false_looks_nothing_up(runs):
    assert WARNING not in runs["off"].stderr
    assert summary(runs, "off")["check"] == {"holds": None, "failed": [], "from": "off", "key": ""}


def test_compare_marks_the_failing_arm_and_looks_up_a_run_that_recorded_none(runs, leak, tmp_path, monkeypatch):
    """A run made before runs recorded their verdict gets one from the lookup (its code unchanged);
    --no-check leaves it unmarked."""
    old = tmp_path / "old"
    shutil.copytree(runs["cwd"] / "first", old)
    record = json.loads((old / "summary.json").read_text())
    del record["check"], record["check/failed"]
    (old / "summary.json").write_text(json.dumps(record))
    monkeypatch.syspath_prepend(str(leak))
    monkeypatch.setenv(V.CACHE_ENV, str(runs["cache"]))
    monkeypatch.setenv(ENV_VAR, str(leak / "conf"))
    for given in (runs["cwd"] / "first", old):
        result = run_cli("compare", str(given), str(runs["cwd"] / "rope"), "--out", str(tmp_path / "report"),
                         cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "training_leak ✗check" in result.stdout and "rope ✗check" not in result.stdout
        assert f"training_leak ✗check: its encoding fails posenc check ({CAUSAL}" in result.stdout
    unchecked = run_cli("compare", str(old), str(runs["cwd"] / "rope"), "--no-check", "--out", str(tmp_path / "r2"),
                        cwd=tmp_path)
    assert unchecked.returncode == 0 and "✗check" not in unchecked.stdout
    # its figure of perplexity against length marks the arm as compare does, and says why
    plotted = run_cli("plot", "extrapolation", str(runs["cwd"] / "first"), str(runs["cwd"] / "rope"), "--out",
                      str(tmp_path / "ppl.png"), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert f"warning: training_leak ✗check: its encoding fails posenc check ({CAUSAL}" in " ".join(plotted.stdout.split())
    assert "rope ✗check" not in plotted.stdout


def test_jobs_asking_for_one_verdict_at_once_measure_it_once(tmp_path, monkeypatch):
    """Two sweep jobs (here two threads, each its own open file, so fcntl's lock sets them apart as it
    does processes) miss the cache together: one measures, the other waits and reads its file."""
    measured = []

    def slow_measure(cfg, key):
        measured.append(key)
        time.sleep(0.5)
        return V.Verdict(key, ("causal",), "measured", 0.5), []

    monkeypatch.setenv(V.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(V, "measure", slow_measure)
    cfg, got = compose(["encoding=nope"], bench=False), []
    threads = [threading.Thread(target=lambda: got.append(V.cached_or_measured(cfg, "k" * 32))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert measured == ["k" * 32] and sorted(v.source for v in got) == ["cache", "measured"]
    assert all(v.failed == ("causal",) for v in got)


def test_a_comment_keeps_a_plugins_verdict_and_a_line_of_code_does_not(leak, tmp_path, monkeypatch):
    root = tmp_path / "plug"
    shutil.copytree(leak, root)
    monkeypatch.delitem(sys.modules, "leakplug", raising=False)  # this copy's, not one imported before
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv(ENV_VAR, str(root / "conf"))
    module = root / "leakplug.py"
    key = V.key_of(compose(["encoding=training_leak"], bench=False))
    module.write_text(module.read_text().replace("class TrainingLeak", "# reworded\n\n\nclass TrainingLeak"))
    assert V.key_of(compose(["encoding=training_leak"], bench=False)) == key
    module.write_text(module.read_text().replace("if self.training else x", "if not self.training else x"))
    assert V.key_of(compose(["encoding=training_leak"], bench=False)) != key
    assert V.key_of(compose(["encoding=training_leak", "+encoding.max_len=64"], bench=False)) != key


def test_shipped_json_holds_every_encoding_and_layout_in_each_precision_and_a_built_in_run_finds_it():
    shipped = json.loads(shipped_path().read_text())["verdicts"]
    assert set(shipped) == {label(entry, p) for entry in entries() for p in PRECISIONS}
    assert V.lookup(compose(["encoding=fire"], bench=False)).source == "shipped"
    assert V.lookup(compose(["encoding=fire", "trainer.precision=bf16"], bench=False)).precision == "bf16"


def remeasured(entry: str) -> None:
    """One shipped entry measured again, as `posenc check --write-shipped` measures it, in each precision:
    the key and the failed rows shipped.json holds, and none failing (every built-in keeps the contract)."""
    shipped = json.loads(shipped_path().read_text())["verdicts"]
    for precision, got in measured(entries()[entry]).items():
        want = shipped.get(label(entry, precision), {})
        assert (got["key"], got["failed"]) == (want.get("key"), want.get("failed")), (
            f"{label(entry, precision)}: measured {got}, shipped {want} (run `posenc check --write-shipped`)")
        assert not got["failed"]


# each class is one scope of pytest-xdist's loadscope (pyproject's addopts), so two workers share them
class TestEveryShippedEncodingIsMeasuredAgain:
    @pytest.mark.parametrize("entry", [e for e in entries() if e.startswith("encoding=")])
    def test_its_verdict_is_the_shipped_one(self, entry):
        remeasured(entry)


class TestEveryShippedLayoutIsMeasuredAgain:
    @pytest.mark.parametrize("entry", [e for e in entries() if e.startswith("layout=")])
    def test_its_verdict_is_the_shipped_one(self, entry):
        remeasured(entry)


def test_a_copy_of_posenc_whose_attention_leaks_the_future_carries_no_shipped_verdict(tmp_path):
    """The shipped verdicts are keyed on the code the check runs, attention included: in a copy of
    posenc whose dense mask shows every key (posenc/nn/dense.py), a run of ALiBi (whose bias goes
    through the dense mask) finds no shipped verdict, measures it, fails the causal row, and says so."""
    import posenc

    source = Path(posenc.__file__).resolve().parent
    copy = tmp_path / "copy" / "posenc"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(str(files(CONFIG_MODULE))), copy / "conf", ignore=shutil.ignore_patterns("__pycache__"),
                    dirs_exist_ok=True)  # posenc.conf, as the wheel installs it
    dense = copy / "nn" / "dense.py"
    anchor = "visible = self.mask.visible(start, end, lo, end, device=self.pos.device)  # (B|1, 1, rows, keys)"
    assert anchor in dense.read_text()
    dense.write_text(dense.read_text().replace(anchor, anchor + "\n        visible = torch.ones_like(visible)"))
    env = {**cli_env(), "PYTHONPATH": str(copy.parent), V.CACHE_ENV: str(tmp_path / "cache")}
    env.pop(ENV_VAR, None)
    run = run_cli("train", "encoding=alibi", *TINY, "hydra.run.dir=run", cwd=tmp_path, env=env, new_python=True)
    assert run.returncode == 0, run.stderr[-3000:]
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["code"]["posenc.nn.encodings.alibi.ALiBi"]["file"].startswith(str(copy))  # the copy ran
    check = json.loads((tmp_path / "run" / "summary.json").read_text())["check"]
    assert check["from"] == "measured" and check["holds"] is False and CAUSAL in check["failed"], check
    assert "warning: encoding 'alibi' fails posenc check (" in run.stderr


def test_the_key_is_the_whole_path_the_precision_and_the_libraries(monkeypatch):
    """Not only the encoding's code: the attention code, the training precision, the positions measured
    and torch's version each make another key (a verdict measured with one is not carried to the other)."""
    cfg = compose(["encoding=alibi"], bench=False)
    key = I.key_of(cfg)
    assert I.key_of(compose(["encoding=alibi", "trainer.precision=bf16"], bench=False)) != key
    assert I.key_of(compose(["encoding=alibi", "eval.lengths=[1,64]"], bench=False)) != key  # 64 × 256 positions
    assert I.key_of(compose(["encoding=alibi", "trainer.seq_len=32"], bench=False)) == key  # 16 × 32 ≤ 4096
    real = I.library_versions()
    assert set(real) == {"torch", "triton", "fla"} and real["torch"].split("+")[0] == torch_version()
    monkeypatch.setattr(I, "library_versions", lambda: {**real, "torch": "0.0"})
    assert I.key_of(cfg) != key
    on_the_path = I.path_files()
    assert {"posenc/nn/dense.py", "posenc/nn/recurrence.py", "posenc/train/state.py"} <= set(on_the_path)
    assert "posenc/check/cuda.py" not in on_the_path and "posenc/check/verdict.py" not in on_the_path


def torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def test_a_warning_names_the_variant_of_a_shipped_encoding():
    """`rope scaling=dynamic`, not `rope`: the run's options where they differ from the encoding's file,
    and the `posenc check` that shows its rows."""
    cfg = compose(["encoding=rope", "encoding.scaling=dynamic", "encoding.scaling_factor=4",
                   "trainer.precision=bf16"], bench=False)
    assert I.variant(cfg) == "rope scaling=dynamic scaling_factor=4"
    line = V.Verdict("k", ("some row",), "measured").warning(I.variant(cfg), I.check_command(cfg))
    assert line.startswith("encoding 'rope scaling=dynamic scaling_factor=4' fails posenc check (some row)")
    assert ("`posenc check encoding=rope encoding.scaling=dynamic encoding.scaling_factor=4 trainer.precision=bf16`"
            in line)
    assert I.variant(compose(["encoding=fox", "encoding@encoding.inner=alibi"], bench=False)) == "fox inner=alibi"
    assert I.variant(compose(["encoding=rope"], bench=False)) == "rope"


def test_cache_files_are_written_through_temporary_files_of_their_own(tmp_path):
    """Two writers of one path never share a temporary file, and none is left behind."""
    from posenc.record.directory import write_json_atomic

    path = tmp_path / "k.json"
    threads = [threading.Thread(target=write_json_atomic, args=(path, {"n": n, "pad": "x" * 100_000}))
               for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json.loads(path.read_text())["n"] in range(8) and [p.name for p in tmp_path.iterdir()] == ["k.json"]


def test_a_run_shorter_than_the_checks_window_is_measured_at_its_own_length(tmp_path, monkeypatch):
    """learned with max_len 16 trains on 16 tokens and keeps the contract; measured on the check's 24
    tokens it would raise in every row (PositionOutOfRange) and be recorded as failing."""
    monkeypatch.setenv(V.CACHE_ENV, str(tmp_path))
    short = compose(["encoding=learned", "encoding.max_len=16", "trainer.seq_len=16"], bench=False)
    assert check_length(short) == 16 and check_length(compose([], bench=False)) == 24
    verdict = V.lookup(short)
    assert verdict.source == "measured" and verdict.failed == ()
    longer = compose(["encoding=learned", "encoding.max_len=16", "trainer.seq_len=12"], bench=False)
    assert V.key_of(longer) != verdict.key  # another window measured: another verdict


def test_a_config_whose_model_cannot_run_the_checks_window_has_no_verdict(tmp_path, monkeypatch):
    """learned with max_len 16 asked to train on 256 tokens: its run refuses its first step; the lookup
    before it says it could not measure, not that learned fails the contract."""
    monkeypatch.setenv(V.CACHE_ENV, str(tmp_path))
    verdict = V.lookup(compose(["encoding=learned", "encoding.max_len=16"], bench=False))
    assert verdict.source == "error" and "PositionOutOfRange" in verdict.error and verdict.failed == ()
    assert not list(tmp_path.glob("*.json"))  # nothing cached: a later, valid config is measured
