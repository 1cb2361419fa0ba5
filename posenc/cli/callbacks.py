"""Hydra's callbacks, called where Hydra's own app calls them.

A user's ``hydra.callbacks`` (each a ``hydra.experimental.callback.Callback``: on_run_start/end,
on_multirun_start/end, on_job_start/end) must see a `posenc train` run or sweep as they would see
any Hydra app's. posenc runs Hydra's steps itself (posenc/cli/hydra_entry.py), and the object that
Hydra's app uses to call them is private, so this is that object, to Hydra's public contract: the
callbacks instantiated from the config in order, the ``*_end`` hooks called in reverse, and a
callback that raises turned into a warning, never the run's end. A launcher plugin calls
on_job_start/on_job_end through ``HydraContext.callbacks`` (``hydra.core.utils.run_job``), in its own
process where it runs jobs elsewhere (submitit pickles this object with the launcher).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf


class Callbacks:
    """The configured callbacks; ``callbacks.on_<hook>(**kwargs)`` calls each one's hook."""

    def __init__(self, config: DictConfig) -> None:
        from hydra.utils import instantiate

        configured = OmegaConf.select(config, "hydra.callbacks") or {}
        self.callbacks = [instantiate(params) for params in configured.values()]

    def __getattr__(self, hook: str) -> Callable[..., None]:
        if not hook.startswith("on_"):  # unpickling looks up __setstate__ and the like first
            raise AttributeError(hook)

        def notify(**kwargs) -> None:
            for callback in reversed(self.callbacks) if hook.endswith("_end") else self.callbacks:
                try:
                    getattr(callback, hook)(**kwargs)
                except Exception as e:  # noqa: BLE001 - as Hydra: a callback's failure is not the run's
                    warnings.warn(f"Callback {type(callback).__name__}.{hook} raised {type(e).__name__}: {e}",
                                  stacklevel=2)

        return notify
