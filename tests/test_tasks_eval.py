"""Task evaluation: exact match over answer positions, Wilson intervals, chance for an untrained model."""

import math

import pytest
import torch
from torch import nn

from posenc.data.synthetic import DIGITS, KEY_MARK, TASKS, make_task
from posenc.eval.tasks import (
    as_metrics,
    generated_answers,
    length_accuracy,
    task_accuracy,
    wilson_interval,
)
from posenc.nn.encodings.base import NoPE
from posenc.nn.encodings.learned import Learned
from posenc.nn.encodings.rope import RoPE
from posenc.nn.model import GPT


class PasskeyReader(nn.Module):
    """Told where the answer is: after the last key mark, predict the digits that followed the
    first key mark (shift=0), or the digit one further along (shift=1, always wrong)."""

    def __init__(self, shift: int = 0) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x):
        B, T = x.shape
        logits = torch.zeros(B, T, 256)
        for b in range(B):
            marks = (x[b] == KEY_MARK).nonzero().flatten()
            first, last = int(marks[0]), int(marks[-1])
            for t in range(last, T):
                logits[b, t, x[b, first + 1 + (t - last) + self.shift]] = 1.0
        return logits, None


class Oracle(nn.Module):
    """Knows every instance: predicts the true next token everywhere."""

    def __init__(self, instances: list[torch.Tensor]) -> None:
        super().__init__()
        self.next = {tuple(r[:-1].tolist()): r[1:] for r in instances}

    def forward(self, x):
        return torch.nn.functional.one_hot(torch.stack([self.next[tuple(r.tolist())] for r in x]), 256).float(), None


def test_a_model_that_reads_the_key_scores_100_and_one_off_scores_0():
    res = task_accuracy(PasskeyReader(), "passkey", 64, n=32, seed=1)
    assert res["accuracy"] == 1.0 and res["correct"] == res["n"] == 32 and res["high"] == 1.0
    assert task_accuracy(PasskeyReader(shift=1), "passkey", 64, n=32, seed=1)["accuracy"] < 0.2


@pytest.mark.parametrize("task", TASKS)
def test_an_oracle_scores_100_at_every_length(task):
    oracle = Oracle([torch.tensor(r) for L in (48, 96) for r in make_task(task, L, 8, seed=0)["ids"]])
    res = length_accuracy(oracle, task, 48, multiples=(1, 2), n=8, seed=0)
    assert [r["accuracy"] for r in res] == [1.0, 1.0] and [r["length"] for r in res] == [48, 96]


def test_an_untrained_model_scores_chance_on_passkey():
    torch.manual_seed(0)
    model = GPT(256, NoPE(64, 4), n_layer=2, n_head=4, d_model=64)
    res = task_accuracy(model, "passkey", 64, n=200, seed=0, digits=1)
    chance = 1 / len(DIGITS)
    assert res["low"] <= chance and res["accuracy"] < 0.3  # no better than guessing one digit


# Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of seven
# methods", Stat. Med. 17:857-872: worked examples (a)-(d), method 3 (Wilson's score interval
# without continuity correction), as published to 4 decimals
NEWCOMBE_WILSON = {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                   (1, 29): (0.0061, 0.1718)}


@pytest.mark.parametrize(("correct", "n"), NEWCOMBE_WILSON)
def test_wilson_interval_matches_newcombes_published_examples(correct, n):
    low, high = wilson_interval(correct, n)
    assert (low, high) == pytest.approx(NEWCOMBE_WILSON[(correct, n)], abs=5e-5)


def test_wilson_interval_stays_in_0_1_and_shrinks_with_n():
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    lo, hi = wilson_interval(30, 100)
    assert lo < 0.3 < hi
    assert wilson_interval(300, 1000)[1] - wilson_interval(300, 1000)[0] < hi - lo


def test_a_length_the_encoding_cannot_encode_is_skipped_not_fatal():
    model = GPT(256, Learned(32, 4, max_len=64), n_layer=1, n_head=4, d_model=32)
    res = length_accuracy(model, "copy", 64, multiples=(1, 2), n=4)
    assert res[0]["accuracy"] is not None and res[1]["accuracy"] is None and "max_len" in res[1]["skipped"]
    assert set(as_metrics("copy", res)) == {f"tasks/copy/{k}@64" for k in ("accuracy", "low", "high", "token_accuracy")}


def test_summary_says_not_applicable_as_null_and_names_are_declared():
    from posenc.eval.tasks import summary
    from posenc.record.metrics import lookup

    model = GPT(256, Learned(32, 4, max_len=64), n_layer=1, n_head=4, d_model=32)
    res = length_accuracy(model, "copy", 64, multiples=(1, 2), n=4)
    out = summary("copy", res)
    assert out["tasks/copy/accuracy@128"] is None and out["tasks/copy/low@128"] is None
    assert out["tasks/copy/accuracy@64"] is not None and out["tasks"]["lengths"][1]["skipped"]
    assert all(lookup(k) is not None for k in out if k != "tasks")


def test_validation_loss_is_log_v_for_a_uniform_model_and_zero_for_one_that_reads_the_key():
    from posenc.data.synthetic import SyntheticTask
    from posenc.eval.tasks import validation_loss

    class Uniform(nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, 256), None

    spec = SyntheticTask(task="passkey")
    assert math.isclose(validation_loss(Uniform(), spec, 64, n=4)["val/loss"], math.log(256), rel_tol=1e-6)

    class Sharp(PasskeyReader):
        def forward(self, x):
            logits, _ = super().forward(x)
            return 100 * logits, None

    assert validation_loss(Sharp(), spec, 64, n=4)["val/loss"] < 1e-6  # only the answer tokens are scored


def test_fractional_eval_multiples_score_a_fine_tuned_run_at_its_parents_lengths():
    """A run fine-tuned at 4T from a parent trained at T = 32: dataset.eval_multiples
    [0.25, 0.5, 1, 2] × 128 scores the parent's 1, 2, 4, 8 × T (the context-extension study)."""
    from posenc.build import build_data
    from posenc.config import compose
    from posenc.eval.tasks import evaluate_task

    cfg = compose(["dataset=synthetic", "dataset.task=passkey", "dataset.eval_multiples=[0.25,0.5,1,2]",
                   "dataset.eval_instances=4"], bench=False)
    spec = build_data(cfg)
    oracle = Oracle([torch.tensor(r) for L in (32, 64, 128, 256) for r in make_task("passkey", L, 4, seed=0)["ids"]])
    res = evaluate_task(oracle, spec, 128, seed=0)
    assert [r["length"] for r in res] == [32, 64, 128, 256] and [r["multiple"] for r in res] == [0.25, 0.5, 1, 2]
    assert [r["accuracy"] for r in res] == [1.0] * 4


class Decoding(nn.Module):
    """A reader decoding with a cache as GPT does, the cache being every token so far: what scoring="generated"
    asks of a model (``new_cache``, ``model(x, cache=c)``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def new_cache(self):
        return {"tokens": None}

    def forward(self, x, cache=None):
        if cache is None:
            return self.inner(x)
        cache["tokens"] = x if cache["tokens"] is None else torch.cat((cache["tokens"], x), dim=1)
        return self.inner(cache["tokens"])[0][:, -x.shape[1]:], None


def test_generated_scoring_has_the_model_produce_the_key():
    """A reader that copies the key scores 100% when it must produce the digits itself, and the one-off
    reader 0%: exact match as teacher forcing gives it (the first wrong digit is read from the same text)."""
    right = task_accuracy(Decoding(PasskeyReader()), "passkey", 64, n=16, seed=1, scoring="generated")
    wrong = task_accuracy(Decoding(PasskeyReader(shift=1)), "passkey", 64, n=16, seed=1, scoring="generated")
    assert right["accuracy"] == 1.0 and right["scoring"] == "generated" and wrong["accuracy"] == 0.0


@pytest.mark.parametrize("task", ["passkey", "mqar", "flip_flop"])
def test_generated_answers_are_the_models_own_decoded_with_its_cache(task):
    """With GPT's cache, each answer token is the argmax of the full forward over the instance's tokens with
    every earlier answer replaced by the model's own: the same predictions as that loop without a cache
    (mqar and flip-flop interleave answers with the instance's tokens)."""
    torch.manual_seed(0)
    model = GPT(256, RoPE(32, 4), n_layer=2, n_head=4, d_model=32).double().eval()
    rows = make_task(task, 48, 3, seed=0).with_format("torch")[:3]
    ids, mask = rows["ids"], rows["answer_mask"]
    with torch.no_grad():
        cached = generated_answers(model, ids, mask)
        fed = ids.clone()
        for t in range(48):  # the loop a user would write: a forward over everything, own answers fed back
            predicted = model(fed[:, : t + 1])[0][:, -1].argmax(-1)
            fed[:, t + 1] = torch.where(mask[:, t], predicted, ids[:, t + 1])
    assert torch.equal(cached[mask], fed[:, 1:][mask])
