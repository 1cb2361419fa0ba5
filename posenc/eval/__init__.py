"""Evaluating a model: validation loss, perplexity at several multiples of the training length
(length extrapolation), loss per position in the window, task accuracy, attention probes, and
`posenc eval` / `posenc probe` on a trained run directory."""
