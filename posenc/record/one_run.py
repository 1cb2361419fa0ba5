"""A path given where one run is wanted (`posenc eval`, `posenc probe`): missing (the nearest path that
exists named), a sweep directory (its runs listed, and one to evaluate where one kept a
checkpoint) or any other folder (a run under it named), each said in one line instead of a missing
checkpoint's message."""

from __future__ import annotations

from posenc.display.commands import shell_word
from posenc.errors import UserError
from posenc.record.directory import missing_path
from posenc.record.rundir import HYDRA_DIR, MULTIRUN_FILE, SWEEP_FILE, RunDir


def require_run(run: RunDir, command: str) -> None:
    """A directory `posenc <command>` reads one run from: it exists, is no sweep directory (its
    runs listed) and holds .hydra/ (else a run under it named), each said in one line."""
    if not run.path.is_dir():
        raise UserError("run dir " + missing_path(run.path, "pass a directory under outputs/ made by `posenc train`"))
    _refuse_sweep_dir(run, command)
    _refuse_non_run_dir(run, command)


def _refuse_sweep_dir(run: RunDir, command: str) -> None:
    path = run.path
    if run.is_run() or not ((path / MULTIRUN_FILE).is_file() or (path / SWEEP_FILE).is_file()):
        return
    runs = sorted((p for p in path.iterdir() if (p / HYDRA_DIR).is_dir()), key=lambda p: (len(p.name), p.name))
    if not runs:
        raise UserError(f"'{path}' is a sweep dir whose jobs never started — it has no run to {command}")
    listed = ", ".join(p.name for p in runs[:8]) + (f", … ({len(runs)} in all)" if len(runs) > 8 else "")
    kept, compare = [p for p in runs if RunDir(p).kept_checkpoint()], f"`posenc compare {shell_word(str(path))}`"
    if not kept:  # trainer.checkpoint=none (the README's sweep, a leaderboard arm): nothing to load
        raise UserError(f"'{path}' is a sweep dir, not one run, and its runs ({listed}) kept no checkpoint (trainer."
                        f"checkpoint=none) to {command} — compare them with {compare}, or train again with "
                        f"trainer.checkpoint=last to {command} one")
    raise UserError(f"'{path}' is a sweep dir, not one run; its runs: {listed} — {command} one with "
                    f"`posenc {command} {shell_word(str(kept[0]))}`, or compare them all with {compare}")


def _refuse_non_run_dir(run: RunDir, command: str) -> None:
    """Not a run directory (a parent of runs, a copy of a checkpoint folder, any other folder):
    said so, with a run under it where there is one, instead of a missing checkpoint's message."""
    if run.is_run():
        return
    path = run.path
    under = sorted(RunDir.under(path), key=lambda r: (str(r.path.parent), len(r.path.name), r.path.name))
    runs = [r.path for r in under if r.kept_checkpoint()]  # evaluable
    if runs:
        raise UserError(f"'{path}' is not a run directory (no {HYDRA_DIR}/ in it); it holds {shell_word(str(runs[0]))}"
                        f"{f' (and {len(runs) - 1} more with a checkpoint under it)' if len(runs) > 1 else ''} — {command} one run with "
                        f"`posenc {command} {shell_word(str(runs[0]))}`")
    if under:  # trainer.checkpoint=none runs (a leaderboard arm's): none to name
        raise UserError(f"'{path}' is not a run directory; its {len(under)} run(s) ({shell_word(str(under[0].path))}, …) "
                        f"kept no checkpoint to {command} — train one with trainer.checkpoint=last (the default) or best")
    raise UserError(f"'{path}' is not a run directory (no {HYDRA_DIR}/ in it, and no run under it) — pass a "
                    f"directory `posenc train` made, e.g. outputs/<date>/<time>_<encoding>")
