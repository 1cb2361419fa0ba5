"""Training: TrainState + train_step (state.py, shared with `posenc bench`), the loop around it
(loop.py: train(cfg, run_dir) -> summary), checkpoints and exact resume, DDP."""
