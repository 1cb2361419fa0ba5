"""Exact-match accuracy on a synthetic task at 1×, 2×, 4×, 8× the training length.

An instance is correct iff the argmax prediction at every answer position is the answer
(teacher-forced: one forward per batch, no sampling), as in the length-generalisation papers
(Kazemnejad et al., 2023; Jelassi et al., 2024). Each length reports the accuracy over n
instances with a 95% Wilson score interval, which stays inside [0, 1] and is honest at 0 and 1.

``scoring="generated"`` (dataset.scoring) has the model produce each answer as a user decoding it
would: greedily, with its KV cache (posenc/nn/decoding.py), its own answer tokens fed back where the
instance's would be. Exact match is then the same as teacher forcing by construction (an instance's
first wrong token is predicted from the same context either way; until then the fed tokens are the
instance's): what it changes is the token accuracy (each token after a mistake continues from it),
and the number of an encoding whose logits at a position depend on the sequence's length (dynamic
NTK: each answer token is predicted from its own prefix, not from the whole window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from posenc.data.synthetic import SyntheticTask, make_task
from posenc.display.terminal import make_console
from posenc.eval.loss import score_batches
from posenc.eval.progress import stage_label
from posenc.nn.encodings.base import PositionOutOfRange
from posenc.record.metrics import (
    TASK_ACCURACY,
    TASK_HIGH,
    TASK_LOW,
    TASK_TOKEN_ACCURACY,
)

MULTIPLES = (1, 2, 4, 8)


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (Wilson, 1927), by scipy.stats; (0, 1)
    when there is nothing to estimate from."""
    if n == 0:
        return 0.0, 1.0
    from scipy import stats  # ~2 s to import: only when a task is scored

    ci = stats.binomtest(correct, n).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)


def instance_correct(predicted: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """predicted, y (B, L), mask (B, L) bool -> (B,) bool: every answer position right."""
    return ((predicted == y) | ~mask).all(dim=1)


def generated_answers(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """The model's greedy predictions (B, L) when it must produce the answers: decoded with its cache from
    the first answer position on, the instance's own token fed where y[t] is no answer and the model's
    prediction where it is. ids (B, L + 1) as the task writes them, mask (B, L)."""
    first = int(mask.any(0).nonzero()[0])  # the prompt: everything before the batch's first answer
    cache = model.new_cache()
    predicted = torch.empty_like(mask, dtype=torch.long)
    predicted[:, : first + 1] = model(ids[:, : first + 1], cache=cache)[0].argmax(-1)
    for t in range(first, mask.shape[1] - 1):
        fed = torch.where(mask[:, t], predicted[:, t], ids[:, t + 1])  # the token at position t + 1
        predicted[:, t + 1] = model(fed[:, None], cache=cache)[0][:, -1].argmax(-1)
    return predicted


@torch.no_grad()
def task_accuracy(model: nn.Module, task: str, length: int, n: int = 256, seed: int = 0,
                  batch_tokens: int = 16384, device: torch.device | str = "cpu", scoring: str = "teacher_forced",
                  **options) -> dict:
    """Exact-match accuracy of ``model`` on ``n`` evaluation instances of ``task`` at ``length``, scored
    teacher-forced or generated (the module doc).

    model(x) must return (logits, _) as posenc.nn.model.GPT does. Returns a JSON-ready dict:
    {length, n, correct, accuracy, low, high, token_accuracy} (token_accuracy: the fraction of
    answer positions right, which shows progress before whole instances are). An encoding that
    cannot represent the length (learned positions beyond max_len) gives accuracy None and the
    reason under "skipped", instead of failing the other lengths.
    """
    ds = make_task(task, length, n, seed, **options).with_format("torch")
    batch = max(1, batch_tokens // length)
    was_training = model.training
    model.eval()
    correct = answers = answers_right = 0
    try:
        for start in range(0, n, batch):
            rows = ds[start : start + batch]
            ids, mask = rows["ids"].to(device), rows["answer_mask"].to(device)
            x, y = ids[:, :-1], ids[:, 1:]
            predicted = model(x)[0].argmax(-1) if scoring == "teacher_forced" else generated_answers(model, ids, mask)
            correct += int(instance_correct(predicted, y, mask).sum())
            answers += int(mask.sum())
            answers_right += int(((predicted == y) & mask).sum())
    except PositionOutOfRange as e:
        return {"length": length, "n": n, "correct": None, "accuracy": None, "low": None, "high": None,
                "token_accuracy": None, "scoring": scoring, "skipped": str(e)}
    finally:
        model.train(was_training)
    low, high = wilson_interval(correct, n)
    return {"length": length, "n": n, "correct": correct, "accuracy": correct / n, "low": low, "high": high,
            "token_accuracy": answers_right / answers, "scoring": scoring}


def task_lengths(train_length: int, multiples: Sequence[float]) -> list[int]:
    """Evaluation lengths in tokens: round(multiple · train_length), each >= 1 (a multiple may be
    a fraction, e.g. 0.25 to score a run trained at 4T at its parent's length T)."""
    return [max(1, round(m * train_length)) for m in multiples]


def length_accuracy(model: nn.Module, task: str, train_length: int, multiples: Sequence[float] = MULTIPLES,
                    n: int = 256, seed: int = 0, batch_tokens: int = 16384, device: torch.device | str = "cpu",
                    progress=None, scoring: str = "teacher_forced", kept: dict[int, dict] | None = None,
                    on_result: Callable[[dict], None] | None = None, **options) -> list[dict]:
    """``task_accuracy`` at every multiple of the training length, each dict with its multiple;
    progress (posenc.eval.progress.StageLines) hears of each length; a length in kept (an
    interrupted evaluation's result, posenc/eval/partial.py) is taken as it is, and on_result hears
    of each of the others as it is scored.

    Metric names for metrics.jsonl / W&B: ``tasks/<task>/accuracy@<length>`` (see ``as_metrics``).
    """
    results = []
    for m, length in zip(multiples, task_lengths(train_length, multiples)):
        label = stage_label(f"{task} accuracy", length, m)
        if kept and length in kept:
            results.append(kept[length])
            if progress is not None:
                progress.keep(label, outcome(kept[length], n))
            continue
        if progress is not None:
            progress.begin(label, n)
        results.append({"multiple": m, **task_accuracy(model, task, length, n, seed, batch_tokens, device, scoring,
                                                       **options)})
        if progress is not None:
            progress.end(outcome(results[-1], n))
        if on_result is not None:
            on_result(results[-1])
    return results


def outcome(result: dict, n: int) -> str:
    """A length's result in a progress line: 'accuracy 0.975 over 256 instances', or why it has none."""
    return f"accuracy {result['accuracy']:.3f} over {n:,} instances" if result["accuracy"] is not None \
        else f"not defined: {result['skipped']}"


def evaluate_task(model: nn.Module, spec: SyntheticTask, train_length: int, seed: int = 0,
                  batch_tokens: int = 16384, device: torch.device | str = "cpu", progress=None,
                  kept: dict[int, dict] | None = None, on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """A run's task evaluation as its config says (dataset=synthetic): ``length_accuracy`` at
    spec.eval_multiples × train_length on spec.eval_instances instances. The seed picks the
    evaluation set; every run of a comparison should pass the same one (e.g. 0), so all
    encodings answer the same instances."""
    return length_accuracy(model, spec.task, train_length, spec.eval_multiples, spec.eval_instances, seed,
                           batch_tokens, device, progress, spec.scoring, kept, on_result, **spec.options)


_FIELDS = {"accuracy": TASK_ACCURACY, "low": TASK_LOW, "high": TASK_HIGH, "token_accuracy": TASK_TOKEN_ACCURACY}


def as_metrics(task: str, results: list[dict]) -> dict[str, float]:
    """Flat metrics for a Tracker: accuracy and its interval per length (skipped lengths left out)."""
    out: dict[str, float] = {}
    for r in results:
        if r["accuracy"] is None:
            continue
        for key, metric in _FIELDS.items():
            out[metric.key(task=task, length=r["length"])] = r[key]
    return out


def summary(task: str, results: list[dict]) -> dict:
    """For summary.json: every length's metrics, null where the encoding cannot represent the
    length ("not applicable", the reason under tasks.lengths[i].skipped), plus the full records."""
    flat = {metric.key(task=task, length=r["length"]): r[key] for r in results for key, metric in _FIELDS.items()}
    return {**flat, "tasks": {"task": task, "lengths": results}}


def validation_loss(model: nn.Module, spec: SyntheticTask, length: int, n: int, batch_size: int = 64,
                    device: torch.device | str = "cpu", autocast=nullcontext) -> dict[str, float]:
    """val/loss and val/ppl of n held-out instances at ``length``, over the targets training
    uses (spec.targets: the answers, or every next token): the validator's number for a task."""

    return score_batches(model, spec.validation_batches(length, n, batch_size), torch.device(device), autocast).metrics()


def log_to(tracker, task: str, results: list[dict], step: int, tokens: int) -> None:
    """Task accuracy to metrics.jsonl / W&B (defined lengths) and a W&B accuracy-against-length
    chart with the Wilson bounds in its table."""
    tracker.log(as_metrics(task, results), step=step, tokens=tokens)
    rows = [[r["length"], r["multiple"], r["accuracy"], r["low"], r["high"]] for r in results if r["accuracy"] is not None]
    tracker.log_curve(f"tasks/{task}/accuracy_by_length", ["length", "multiple", "accuracy", "low", "high"], rows,
                      "length", "accuracy", step, tokens, title=f"{task}: exact-match accuracy against length")


def show(record: dict, task: str, results: list[dict]) -> None:
    """The terminal table of `posenc eval` on a task: exact-match accuracy per length."""
    from rich.table import Table


    scoring = next((r["scoring"] for r in results if r.get("scoring")), "teacher_forced")
    table = Table(title=f"{record['encoding']['name']} — {task}, trained at {record['seq_len']} tokens"
                        f"{', answers generated with the cache' if scoring == 'generated' else ''}",
                  title_justify="left")
    for name in ("length", "× train", "accuracy", "95% interval", "token accuracy", "n"):
        table.add_column(name, justify="right")
    table.add_column("note")
    for r in results:
        defined = r["accuracy"] is not None
        table.add_row(f"{r['length']:,}", f"{r['multiple']:g}", f"{r['accuracy']:.3f}" if defined else "—",
                      f"{r['low']:.3f}–{r['high']:.3f}" if defined else "—",
                      f"{r['token_accuracy']:.3f}" if defined else "—", str(r["n"]), r.get("skipped", ""))
    make_console().print(table)  # as wide as posenc's other output without a terminal
