"""Training: TrainState + train_step (state.py, shared with `posenc bench`), the loop around it
(loop.py: train(cfg, run_dir) -> summary), checkpoints and exact resume, DDP."""

from posenc.train.state import BatchSource, StepResult, TrainState, micro_batches, new_train_state, train_step

__all__ = ["BatchSource", "StepResult", "TrainState", "micro_batches", "new_train_state", "train_step"]
