"""Training: trainer, pipelined step, metrics, checkpoints.

- :mod:`.build`: config -> process groups, tables, data, loaders, plan;
- :mod:`.step`: the module DDP wraps (pooled AlltoAll under the bottom MLP), phase timers;
- :mod:`.pipeline`: the pipelined loop (three batches in flight) and the plain loop;
- :mod:`.trainer`: :class:`~neo.train.trainer.Trainer` (``fit``, ``evaluate``);
- :mod:`.checkpoint`: atomic, resharding checkpoints;
- :mod:`.run_log`: metrics.jsonl, TensorBoard, progress bar;
- :mod:`.metrics`, :mod:`.schedule`: exact AUC across ranks; the learning-rate schedule.

``python -m neo.train CONFIG [key=value ...]`` (what torchrun launches) = ``neo train``; see docs/training.md.
"""
