"""Runtime: the train loop, parallelism, checkpoints and metrics."""
