"""Training: trainer, pipelined step, metrics, checkpoints."""
