"""`posenc eval RUN_DIR [overrides…]`: perplexity (or, on a synthetic task, accuracy) of a trained
run at several lengths, and its per-position loss.

Loads the run's composed config (``.hydra/config.yaml``) and its checkpoint (``checkpoints/
best.safetensors`` where trainer.checkpoint=best kept one, else ``last.safetensors``), applies
overrides written as for `posenc train` (``eval.lengths=[1,2]``, ``eval.stride=64``,
``encoding.scaling=yarn encoding.scaling_factor=4``, ``device=cpu``), evaluates, prints a
table and writes ``eval.json`` (``eval_<key>-<value>….json`` when overrides change the setup:
output_name), after each length: a Ctrl-C leaves the lengths finished, and the same command run
again scores only what is missing (posenc/eval/partial.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from posenc.build import build_data, build_model, encoding_summary, restore_weights, seed_everything
from posenc.config import parse_overrides
from posenc.display.terminal import make_console
from posenc.display.commands import command, shell_word
from posenc.eval import evaluation, final, partial, per_position, proof
from posenc.eval.progress import StageLines
from posenc.hardware import resolve_precision, setup_device
from posenc.record import kernel_record, provenance
from posenc.record.directory import plain_number, short_keys
from posenc.record.metrics import STEPS
from posenc.record.one_run import require_run
from posenc.record.rundir import RunDir, eval_file_name, load_run_config

console = make_console()  # the `posenc eval` command's output, for people
err_console = make_console(stderr=True)  # warnings


def output_name(overrides: list[str]) -> str:
    """eval.json, or eval_<key>-<value>_….json so evaluations with other settings sit side by side:
    eval.lengths=[1,2,4] -> eval_lengths-1-2-4.json, encoding.scaling=yarn encoding.scaling_factor=4
    -> eval_scaling-yarn_scaling_factor-4.json (each key's last part; no '=' or '/' in the name).
    The same overrides give the same name, so a re-evaluation replaces its file (atomically)."""

    if not overrides:
        return eval_file_name()
    parsed = parse_overrides(overrides)
    short = short_keys([o.key for o in parsed])
    parts = []
    for o in parsed:
        value = plain_number(o.value) if isinstance(o.value, (int, float)) else o.override.get_value_element_as_str()
        parts.append(re.sub(r"[^A-Za-z0-9._]+", "-", f"{short[o.key]}-{value}").strip("-"))
    return eval_file_name('_'.join(parts)[:120].rstrip('_-.'))


def load_trained(run: RunDir | Path, overrides: list[str], command: str = "eval"):
    """(cfg, data, model on its device, checkpoint state, autocast, proof) of a finished or stopped
    run: what `posenc eval` and `posenc probe` (command) start from. Every file is read through one
    RunDir: its config once, its checkpoint resolved once. The model is built as training built it
    (the run's seed set first) and proved against its checkpoint's probe batch (``proof``, the
    record eval.json and probes.json keep; one warning where it does not reproduce it)."""

    run = RunDir.of(run)
    require_run(run, command)  # missing, a sweep's dir or any other folder: said so, not "no checkpoint"
    state = run.load_checkpoint()  # missing, corrupt or foreign: one line saying so
    changed = warn_code_changes(run)
    cfg = load_run_config(run, overrides)
    device, _, autocast = setup_device(cfg.device, cfg.trainer.precision)  # as training: TF32, autocast
    data = build_data(cfg)
    seed_everything(cfg.seed)  # a buffer drawn from the seeded generator is the run's own
    model = build_model(cfg, data.vocab_size)
    restore_weights(model, state, run.checkpoint_to_load())
    model = model.to(device)
    proved = prove(run, state, model, cfg, changed)
    return cfg, data, model, state, autocast, proved


def prove(run: RunDir, state: dict, model: nn.Module, cfg: DictConfig, changed: list[str]) -> dict:
    """The rebuilt model against the probe batch its checkpoint holds (eval/proof.py): one warning line
    where it does not reproduce it, or where the checkpoint holds no probe; the record."""
    checkpoint = str(run.checkpoint_to_load().relative_to(run.path))
    record = proof.prove(model, state, checkpoint, load_run_config(run, []), cfg, lambda: changed)
    proof.say(record, lambda line: err_console.print(line, highlight=False, soft_wrap=True))
    return record


def warn_code_changes(run: RunDir | Path) -> list[str]:
    """One line when the run's encoding code differs from what it was trained with (provenance.json):
    each changed definition, file by file; the changes, for eval.json."""

    run = RunDir.of(run)
    changed = provenance.changes(run)
    if changed:
        err_console.print(f"warning: the encoding code changed since {run.path} was trained: {'; '.join(changed)} — "
                          f"these results come from today's code, not the run's", highlight=False, soft_wrap=True)
    return changed


def show_kernels(evaluated: dict, trained: dict | None) -> None:
    """How the evaluation's kernels ran (each layer kind's path, every fallback), and the training's
    fallbacks where it had any: numbers from unlike paths differ in speed and, at the last bits, in value."""
    console.print(f"kernels: {kernel_record.signature(evaluated)}", highlight=False, soft_wrap=True)
    for line in kernel_record.lines(evaluated):
        console.print(f"  evaluation fell back: {line}", highlight=False, soft_wrap=True)
    for line in kernel_record.lines(trained):
        console.print(f"  training fell back: {line}", highlight=False, soft_wrap=True)


def eval_run(run_dir: Path, overrides: list[str],
             verdict_of: Callable[[DictConfig], dict | None] | None = None) -> tuple[dict, Path]:
    """Evaluate run_dir's last checkpoint at cfg.eval.lengths; returns (record, written path). The
    record holds the precision it computed in (trainer.precision resolved, as training resolves it), what
    changed in the encoding's code since training (``code_changes``), whether the checkpoint rebuilt the
    model that trained (eval/proof.py) and, where verdict_of is given (the CLI's: posenc/check/verdict.py),
    `posenc check`'s verdict on it. The record is written after each length and an interrupted one is
    resumed (posenc/eval/partial.py)."""

    run = RunDir(run_dir)
    cfg, data, model, state, autocast, proved = load_trained(run, overrides)
    device = next(model.parameters()).device
    out = run.path / output_name(overrides)
    changes = provenance.changes(run)  # the same list the warning named (its parses cached)
    key = partial.evaluation_key(cfg, run.checkpoint_to_load(), state.get("step"), changes)
    header = {"run_dir": str(run.path), "overrides": overrides, "step": state.get("step"),
              "seq_len": cfg.trainer.seq_len, "encoding": encoding_summary(model.encoding), "device": str(device),
              "precision": resolve_precision(cfg.trainer.precision, device),  # what autocast computed in
              "code_changes": changes,  # the same list the warning named (its parses cached)
              proof.RECORD_KEY: proved,  # whether the checkpoint rebuilt the model that trained (eval/proof.py)
              **({"check": verdict_of(cfg)} if verdict_of is not None else {}), partial.KEY: key}
    stem, summary = run.per_position_stem(out), run.summary() or {}
    positions = per_position_pass(run, cfg, overrides, state, changes, summary)
    earlier, other = partial.read_record(out, key)  # an interrupted run of this very evaluation, or of another
    kept = evaluation.kept_results(data, earlier) if earlier else {}
    kept_positions = kept_per_position(run.path / f"{stem}.json", key) if earlier else {}
    if other:
        console.print(f"{out.name}: an interrupted evaluation of another checkpoint or other settings; "
                      f"starting over", style="dim", highlight=False, soft_wrap=True)

    progress = StageLines(console)  # a line per length and every 30 s within one: a log shows where the time goes
    stages = [s for s in evaluation.stages(data, cfg) if positions or s.kind != per_position.STAGE]
    progress.plan(stages, model.flops_per_token)
    record = partial.PartialRecord(out, header, stages, progress.finished)
    if cfg.eval.get("stride"):  # two passes over the overlapping windows: say so before the time goes
        console.print(f"eval.stride={cfg.eval.stride}: windows start every {cfg.eval.stride} tokens, so each length "
                      f"scores length/{cfg.eval.stride} times as many windows"
                      + (f", in two passes: the sliding perplexity (each window's last {cfg.eval.stride} targets), "
                         f"then the per-position loss (every position of each window; eval.per_position=false "
                         f"skips it)" if positions else ""), style="dim", highlight=False, soft_wrap=True)
    done: list = list(kept.values())

    def save(result) -> None:  # each length's result on disk as it completes
        done.append(result)
        record.results = evaluation.summarise(data, cfg, done)

    record.results = evaluation.summarise(data, cfg, done)  # what the interrupted evaluation had kept

    try:
        record.write()  # from the start: a run stopped in its first length leaves a record saying so
        result = evaluation.evaluate(data, model, cfg, device, autocast, on_result=lambda r: (save(r), record.write()),
                                     progress=progress, kept=kept)
        record.results = result.summary
        record.write()
        if positions:  # per-position loss beside it: per_position_eval.json / .png (training wrote per_position.*)
            final.per_position_files(model, data, cfg, run.path, device, autocast, stem=stem, progress=progress,
                                     kept=kept_positions, extra={partial.KEY: key}, on_length=lambda: record.write())
    except KeyboardInterrupt:
        raise record.stopped(command("posenc", "eval", shell_word(str(run.path)), *map(shell_word, overrides))) from None
    written = record.write({kernel_record.KEY: model.kernels.record()})  # how this evaluation ran
    result.show(written)
    show_kernels(written[kernel_record.KEY], summary.get(kernel_record.KEY))
    console.print(f"wrote [bold]{out}[/]")
    return written, out


def per_position_pass(run: RunDir, cfg: DictConfig, overrides: list[str], state: dict, changes: list[str],
                      summary: dict) -> bool:
    """Whether this evaluation computes the per-position loss: eval.per_position asks for it, and
    training's own per_position.json is not already the same thing (no overrides, the checkpoint
    training ended with, the code it ran: its summary's steps), which a plain `posenc eval RUN_DIR`
    would only copy."""
    if not cfg.eval.per_position:
        return False
    trained = run.path / f"{run.per_position_stem()}.json"
    if not overrides and not changes and trained.is_file() and summary.get(STEPS.name) == state.get("step"):
        console.print(f"per-position loss: training's {trained.with_suffix('.png').name} already holds it "
                      f"(this checkpoint, these settings): not computed again", style="dim", highlight=False,
                      soft_wrap=True)
        return False
    return True


def kept_per_position(path: Path, key: str) -> dict[int, dict]:
    """The lengths an interrupted evaluation with this key wrote into its per-position record, by length."""
    import json

    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if record.get(partial.KEY) != key:
        return {}
    return {r["length"]: r for r in record.get("lengths", [])}
