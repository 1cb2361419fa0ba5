"""Run every property on one subject and return typed results, in the order of CHECKS.

A property whose code raises (an IndexError past a table, a shape error in a hook) is a ✗ row
naming the exception: the encoding broke the contract, the checker did not.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from posenc.check import cuda, decoding, flex_backward, kernel, learning, length, model, paths, precision, state
from posenc.check.results import CheckResult, raised
from posenc.check.subject import Subject

Check = Callable[[Subject], list[CheckResult]]

#: (what it checks, the property), in the order the table shows them
CHECKS: tuple[tuple[str, Check], ...] = (
    ("causality", model.causality),
    ("prefix consistency", length.prefix_consistency),
    ("loss at init", model.loss_at_init),
    ("default positions", model.default_positions),
    ("batch independence", model.batch_independence),
    ("attention paths", paths.attention_paths),
    ("fused kernel", kernel.fused_kernel),
    ("bias forms", paths.bias_forms),
    ("score_mod backward", flex_backward.score_mod_backward),
    ("shift invariance", paths.shift_invariance),
    ("precision", precision.precision_rows),
    ("documents packing", model.documents),
    ("sliding windows", model.windows),
    ("every parameter learns", learning.every_parameter_learns),
    ("safetensors round trip", state.round_trip),
    ("resume", state.resume),
    ("past the training length", model.past_training),
    ("decoding", decoding.cache_consistency),
    ("CUDA", cuda.cuda_checks),
)


def check_version() -> str:
    """Which checks `posenc check` runs, as 8 hex digits of a SHA-256 over their names in order:
    a property added, removed or renamed changes it (what the benchmark's rows record)."""
    import hashlib

    return hashlib.sha256("\n".join(what for what, _ in CHECKS).encode()).hexdigest()[:8]


def run_checks(subject: Subject, on_result: Callable[[CheckResult], None] | None = None,
               only: Collection[str] | None = None) -> list[CheckResult]:
    """Every check of CHECKS on subject (or those whose name is in only, as CHECKS spells it); on_result
    hears each row as it is measured. One CPU thread: the tiny model's matmuls gain nothing from
    more, and on a busy machine the threads' spinning makes them many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [row for what, check in CHECKS if only is None or what in only
                for row in run_one(what, check, subject, on_result)]
    finally:
        torch.set_num_threads(threads)


def run_one(what: str, check: Check, subject: Subject,
            on_result: Callable[[CheckResult], None] | None) -> list[CheckResult]:
    """One check's rows (one ✗ row naming the exception where it raises)."""
    try:
        rows = check(subject)
    except Exception as e:  # noqa: BLE001 - a hook that raises fails its property, with the reason
        rows = [raised(what, e)]
    for row in rows:
        if on_result is not None:
            on_result(row)
    return rows
