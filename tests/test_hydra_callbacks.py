"""A user's Hydra callbacks (``hydra.callbacks``, each a ``hydra.experimental.callback.Callback``) see a
`posenc train` run and sweep as they see any Hydra app's: posenc runs Hydra's steps itself
(posenc/cli/hydra_entry.py), so it calls them itself (posenc/cli/callbacks.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback

from conftest import TINY, run_cli


class Recorder(Callback):
    """Appends each hook's name (and, at a job's end, the run's status) to a JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _seen(self, hook: str, **extra) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"hook": hook, **extra}) + "\n")

    def on_run_start(self, config, **kwargs) -> None:
        self._seen("on_run_start")

    def on_run_end(self, config, **kwargs) -> None:
        self._seen("on_run_end")

    def on_multirun_start(self, config, **kwargs) -> None:
        self._seen("on_multirun_start")

    def on_multirun_end(self, config, **kwargs) -> None:
        self._seen("on_multirun_end")

    def on_job_start(self, config, **kwargs) -> None:
        self._seen("on_job_start")

    def on_job_end(self, config, job_return, **kwargs) -> None:
        self._seen("on_job_end", status=job_return.return_value["status"])


def test_a_users_callbacks_see_a_run_and_a_sweep_as_in_hydras_app(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    callback = [f"+hydra.callbacks.recorder._target_={__name__}.Recorder", f"+hydra.callbacks.recorder.path={seen}"]
    budget = [*TINY, "trainer.max_steps=1", "trainer.eval_interval=1"]

    result = run_cli("train", *budget, *callback, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    hooks = [json.loads(line) for line in seen.read_text().splitlines()]
    assert hooks == [{"hook": "on_run_start"}, {"hook": "on_job_start"}, {"hook": "on_job_end", "status": "completed"},
                     {"hook": "on_run_end"}]

    seen.unlink()
    result = run_cli("train", "-m", *budget, *callback, cwd=tmp_path)  # a sweep of one job
    assert result.returncode == 0, result.stderr[-2000:]
    hooks = [json.loads(line)["hook"] for line in seen.read_text().splitlines()]
    assert hooks == ["on_multirun_start", "on_job_start", "on_job_end", "on_multirun_end"]
