"""A rich progress bar for training: step, loss, ppl, tokens/s."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainProgress:
    def __init__(self, total_steps: int, description: str = "train") -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  ppl {task.fields[ppl]}  {task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self.task = self.progress.add_task(description, total=total_steps, loss="-", ppl="-", tps="-")

    def __enter__(self) -> TrainProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def advance(self, step: int) -> None:
        self.progress.update(self.task, completed=step)

    def update(self, step: int, loss: float, ppl: float | None, tokens_per_s: float) -> None:
        self.progress.update(
            self.task, completed=step, loss=f"{loss:.3f}", ppl="-" if ppl is None else f"{ppl:.2f}",
            tps=f"{tokens_per_s:,.0f}",
        )
