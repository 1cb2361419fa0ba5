"""The metric registry: every name a run writes is declared once, with the direction a reader
expects; W&B summarises history metrics by their declared best."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.record import metrics as M
from posenc.record.tracking import Tracker

#: the names the README promises in metrics.jsonl / summary.json / W&B, and which way is better
EXPECTED = {
    "train/loss": "lower", "train/lr": None, "train/grad_norm": None, "train/tokens_per_s": "higher",
    "train/mfu": "higher", "val/loss": "lower", "val/ppl": "lower", "val/bpb": "lower",
    "extrapolation/ppl@512": "lower", "convergence/tokens_to_loss@2.5": "lower",
    "convergence/seconds_to_loss@2": "lower", "convergence/val_loss_auc": "lower", "tokens_per_s": "higher",
    "convergence/tokens_to_bpb@1.2": "lower", "convergence/seconds_to_bpb@1": "lower",
}


@pytest.mark.parametrize(("key", "better"), EXPECTED.items())
def test_every_promised_name_is_declared_with_its_direction(key, better):
    metric = M.lookup(key)
    assert metric is not None, key
    assert metric.better == better


def test_a_family_names_its_members_and_reads_them_back():
    key = M.EXTRAPOLATION_PPL.key(length=4096)
    assert key == "extrapolation/ppl@4096" and M.EXTRAPOLATION_PPL.match(key) == {"length": "4096"}
    assert M.TOKENS_TO_LOSS.key(target=2.0) == "convergence/tokens_to_loss@2"  # as trainer.convergence_targets=[2.0]
    assert M.EXTRAPOLATION_PPL.match("extrapolation/ppl@") is None and M.lookup("val/losses") is None


def test_each_name_is_declared_once_and_means_one_thing():
    """A name in metrics.jsonl, summary.json or W&B has one declaration: the x-axis column every
    row carries (`tokens`) is the summary's tokens-seen counter, not a second metric of that name."""
    names = [m.name for m in M.METRICS]
    assert len(names) == len(set(names))
    assert M.lookup(M.TOKENS) is M.TOKENS_SEEN and M.TOKENS_SEEN.name == M.TOKENS
    for axis in (M.TOKENS, M.STEP):  # the row columns that are not metrics of their own
        assert [m for m in M.METRICS if m.match(axis) is not None] in ([], [M.TOKENS_SEEN])


def test_wandb_keeps_the_best_and_the_last_validation_loss(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracker(tmp_path)
    tracker.start_wandb(config={}, project="posenc-test", mode="offline")
    for step, loss in enumerate([3.0, 2.0, 2.5], start=1):
        tracker.log({"val/loss": loss, "train/tokens_per_s": 100.0 * step}, step=step, tokens=10 * step)
    tracker.log({"train/lr": 0.1}, step=4, tokens=40)  # W&B commits step 3 when step 4 begins
    tracker.summary({"status": "completed", "val/loss": 2.5, "params": 7})  # as train writes it at the end
    summary = {k: (dict(v) if hasattr(v, "keys") else v) for k, v in dict(tracker.wandb_run.summary).items()}
    tracker.finish()
    assert summary["val/loss"] == {"last": 2.5, "min": 2.0}
    assert summary["train/tokens_per_s"] == {"last": 300.0, "max": 300.0}
    assert summary["params"] == 7 and summary["status"] == "completed"
    assert json.loads((tmp_path / "summary.json").read_text())["val/loss"] == 2.5  # the file keeps the final value


def test_a_target_is_nats_of_val_loss_or_bits_per_byte_with_a_bpb_suffix():
    assert M.parse_target("2.5") == M.Target(2.5) and M.parse_target(2.0).tokens_key == "convergence/tokens_to_loss@2"
    bpb = M.parse_target("1.2bpb")
    assert bpb.bpb and bpb.curve_metric is M.VAL_BPB and bpb.tokens_key == "convergence/tokens_to_bpb@1.2"
    assert M.target_of(bpb.tokens_key) == bpb and M.target_of("val/loss") is None
    with pytest.raises(ValueError, match="bpb suffix"):
        M.parse_target("1.2 bits")


def test_a_bpb_target_is_read_from_val_bpb_so_tokenizers_compare():
    # two tokenizers, one byte-level (1 byte/token), one with 4 bytes/token: the same bits per
    # byte curve is a val/loss curve 4× higher for the second, yet reaches 1.0 bpb at the same point
    bpb = [(100, 1.5), (200, 1.1), (300, 0.9)]
    for bytes_per_token in (1, 4):
        rows = [{"tokens": t, "val/loss": b * 0.6931471805599453 * bytes_per_token, "val/bpb": b} for t, b in bpb]
        m = M.convergence_metrics(rows, ["1bpb"])
        assert m["convergence/tokens_to_bpb@1"] == 250  # halfway between 1.1 at 200 and 0.9 at 300
