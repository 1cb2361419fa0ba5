"""One interface over the run's own files and Weights & Biases.

Every log step becomes one JSON object in ``metrics.jsonl`` (with ``step`` and ``tokens``)
and, when ``logger=wandb``, the same dict in W&B with ``tokens`` as the x-axis. W&B never
blocks a run: no key or no network falls back to offline with one warning.

W&B learns from the metric declarations (posenc.record.metrics) how to summarise each history
metric: its last value and its best one (``val/loss`` -> last and min, ``train/mfu`` -> last
and max), so a runs table can sort by either; summary.json keeps the final values.
"""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
from pathlib import Path
from typing import Any

from posenc.record.directory import write_json_atomic
from posenc.record.metrics import METRICS, STEP, TOKENS, lookup
from posenc.record.rundir import RunDir

log = logging.getLogger("posenc")


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or inf: write null so every reader can parse the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Tracker:
    """Writes metrics.jsonl / summary.json in ``run_dir`` and mirrors them to W&B if enabled."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.run = RunDir(run_dir)
        self.enabled = enabled
        self.wandb_run = None
        self._metrics = open(self.run.metrics_file, "a") if enabled else None

    def start_wandb(
        self,
        config: dict,
        project: str,
        mode: str = "offline",
        group: str | None = None,
        job_type: str = "train",
        tags: list[str] | None = None,
        name: str | None = None,
        run_id: str | None = None,
        entity: str | None = None,
    ) -> None:
        """Start a W&B run in this run dir. Online without a key or network degrades to offline."""
        if mode == "disabled" or not self.enabled:
            return
        import wandb

        if mode == "online" and not (os.environ.get("WANDB_API_KEY") or _has_netrc_key()):
            log.warning("W&B: no API key found (run `wandb login`); logging offline instead")
            mode = "offline"
        kwargs = dict(project=project, entity=entity, group=group, job_type=job_type, tags=tags or [],
                      name=name, config=config, dir=str(self.run.path), id=run_id, resume="allow")
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, init_timeout=30)
        try:
            self.wandb_run = wandb.init(mode=mode, settings=settings, **kwargs)
        except Exception as e:  # network trouble or a server refusal: never lose the run
            if mode == "offline":
                log.warning("W&B could not start (%s); continuing without it", e)
                return
            log.warning("W&B online failed (%s); logging offline instead", e)
            self.wandb_run = wandb.init(mode="offline", settings=settings, **kwargs)
        self.wandb_run.define_metric(TOKENS)
        self.wandb_run.define_metric("*", step_metric=TOKENS)
        for metric in METRICS:
            if metric.wandb_summary:
                self.wandb_run.define_metric(metric.wandb_name, step_metric=TOKENS, summary=metric.wandb_summary)

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def log(self, metrics: dict[str, float], step: int, tokens: int) -> None:
        if not self.enabled:
            return
        row = {STEP: step, TOKENS: tokens, **{k: _json_safe(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({TOKENS: tokens, **metrics}, step=step)

    def event(self, name: str, data: dict[str, Any], step: int, tokens: int) -> None:
        """Something that happened at a step (a kernel's fallback): a metrics.jsonl row of its own,
        ``{"step", "tokens", "event": name, name: data}``, beside the metric rows (which readers pick by key)."""
        if not self.enabled:
            return
        row = {STEP: step, TOKENS: tokens, "event": name, name: {k: _json_safe(v) for k, v in data.items()}}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()

    def describe(self, key: str, record: dict[str, Any]) -> None:
        """A nested record of how the run ran (posenc/nn/kernels.py's): in the W&B run's config under
        ``key``, and in its summary as flat ``key/a/b`` values (W&B's summary shows scalars; a list, as
        lines of text). summary.json holds the record as it is (``summary``)."""
        if self.wandb_run is None:
            return
        self.wandb_run.config.update({key: record}, allow_val_change=True)
        for name, value in flat(record, key).items():
            self.wandb_run.summary[name] = value

    def log_curve(self, key: str, columns: list[str], rows: list[list], x: str, y: str, step: int, tokens: int,
                  stroke: str | None = None, title: str = "") -> None:
        """A curve that is not a history (accuracy against length, loss against position): a
        line chart (``<key>``), one line per ``stroke`` value, whose table W&B logs once with it
        (``<key>_table``: W&B stores a chart's data as a table of that name). The run's own files
        hold it as JSON already, so only W&B gets it."""
        if self.wandb_run is None or not rows:
            return
        import wandb

        table = wandb.Table(columns=columns, data=rows)
        chart = wandb.plot.line(table, x, y, stroke=stroke, title=title or key)
        self.wandb_run.log({TOKENS: tokens, key: chart}, step=step)

    def log_model(self, paths: list[Path], name: str, metadata: dict, aliases: list[str]) -> str | None:
        """Files of the run dir (its checkpoint, and what makes a folder a run dir) as one W&B
        artifact of type ``model``, ``name`` with these aliases, each under its path in the run dir:
        how a lab shares a model (``run.use_artifact("<name>:latest").download()`` is a run dir
        `posenc eval` reads). Offline it is kept in the offline run and uploads with ``wandb sync``.
        Its name, or None without W&B."""
        if self.wandb_run is None or not paths:
            return None
        import wandb

        artifact = wandb.Artifact(name, type="model", metadata=metadata)
        for path in paths:
            artifact.add_file(str(path), name=path.relative_to(self.run.path).as_posix())  # checkpoints/last.safetensors
        self.wandb_run.log_artifact(artifact, aliases=aliases)
        return name

    def log_images(self, images: dict[str, Path], step: int | None, tokens: int) -> None:
        """PNG figures the run wrote (per-position loss, probes) as W&B images under their keys;
        step None: W&B's next step (a resumed run, e.g. `posenc probe` after training)."""
        if self.wandb_run is None or not images:
            return
        import wandb

        self.wandb_run.log({TOKENS: tokens, **{k: wandb.Image(str(p)) for k, p in images.items()}}, step=step)

    def summary(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        write_json_atomic(self.run.summary_file, summary)
        if self.wandb_run is not None:
            for k, v in summary.items():
                if _summarised_by_wandb(k, v):
                    continue  # W&B holds its last (= this) and best value; writing it would drop the best
                if isinstance(v, (int, float, str, bool)) or v is None:
                    self.wandb_run.summary[k] = v

    def finish(self, exit_code: int = 0) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self.wandb_run is not None:
            try:
                self.wandb_run.finish(exit_code=exit_code)
            finally:
                self.wandb_run = None


def flat(record: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Scalars under slash-joined keys: {'a': {'b': 1}, 'c': [{'d': 2}], 'e': [3, 4]} ->
    {'prefix/a/b': 1, 'prefix/c/0/d': 2, 'prefix/e': '3, 4'} (a list of dicts by index, of scalars as text)."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        name = f"{prefix}/{k}"
        if isinstance(v, dict):
            out.update(flat(v, name))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, dict) for x in v):
            out.update(flat({str(i): x for i, x in enumerate(v)}, name))
        elif isinstance(v, (list, tuple)):
            out[name] = ", ".join(map(str, v))
        else:
            out[name] = v
    return out


def _summarised_by_wandb(key: str, value: Any) -> bool:
    """A logged history metric that define_metric told W&B to summarise (last and best)."""
    metric = lookup(key)
    return value is not None and metric is not None and metric.wandb_summary is not None


def _has_netrc_key(host: str = "api.wandb.ai") -> bool:
    """Whether ~/.netrc (or $NETRC) holds a password for W&B's API host, as `wandb login` writes it."""
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return entry is not None and bool(entry[2])
