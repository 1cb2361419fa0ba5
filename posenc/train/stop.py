"""SIGTERM and Ctrl-C: a run that stops where it can continue.

While the training loop runs, SIGTERM and the first Ctrl-C only ask it to stop (GracefulStop): it
finishes its step, saves a checkpoint and raises RunInterrupted, whose one line names the command
that continues the run, on as many processes as it ran on (``resume_command``).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from posenc.display.commands import command, override
from posenc.errors import UserError
from posenc.record.rundir import RunDir
from posenc.train import distributed
from posenc.train.progress import to_log_files


class RunInterrupted(UserError):
    """SIGTERM or Ctrl-C: a checkpoint was saved and the run can be resumed."""

    def __init__(self, message: str, signum: int, exit_code: int | None = None, quiet: bool = False) -> None:
        super().__init__(message)
        self.signum = signum
        # the shell's convention: 130 after Ctrl-C, 143 after SIGTERM (0 for torchrun's workers: GracefulStop.stop)
        self.exit_code = 128 + signum if exit_code is None else exit_code
        self.quiet = quiet  # a DDP rank other than 0: rank 0 alone says it


def resume_command(run_dir: Path, world_size: int, per_node: int | None = None) -> str:
    """The command that continues run_dir on world_size processes (its overrides come from the run dir)."""
    return command(distributed.launch_command(world_size, per_node), "train", override("trainer.resume", run_dir))


class GracefulStop:
    """While active, SIGTERM and the first Ctrl-C only set ``requested``: the loop finishes its
    step, saves a checkpoint and stops. A second Ctrl-C interrupts at once; one within a second of
    the first is the same Ctrl-C (torchrun sends each worker the SIGINT the terminal sent it too)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    SAME_CTRL_C_S = 1.0

    def __init__(self) -> None:
        self.received: int | None = None
        self._at = 0.0
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT and time.monotonic() - self._at > self.SAME_CTRL_C_S:
            raise KeyboardInterrupt
        if self.received is None:
            self.received, self._at = signum, time.monotonic()

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def stop(self, run_dir: Path, step: int, saved: bool = True) -> None:
        """Raise the RunInterrupted that ends the run, naming the command that continues it: on
        as many processes as it ran on. Under DDP rank 0 alone says it. A torchrun worker whose
        checkpoint is saved exits 0: torchrun reads any other code as a failure, prints its
        ChildFailedError report and, with --max-restarts, starts the workers again as a new run."""
        signum = self.received or signal.SIGINT
        quiet = not distributed.is_main()
        if not saved:
            raise RunInterrupted(f"stopped by {self.name} at step {step}; trainer.checkpoint=none kept no checkpoint, "
                                 f"so it cannot be resumed — start a new run (with trainer.checkpoint=last to resume)",
                                 signum, quiet=quiet)
        # the run's overrides are restored from its run dir
        resume = resume_command(run_dir, distributed.world_size(), distributed.requested_per_node())
        message = (f"stopped by {self.name} at step {step}; checkpoint saved in {RunDir(run_dir).checkpoint()} — "
                   f"continue with `{resume}`")
        if not quiet:
            to_log_files(f"interrupted: {message}")  # train.log says why it ends here (the console gets the error line)
        raise RunInterrupted(message, signum, exit_code=0 if distributed.under_torchrun() else None, quiet=quiet)
