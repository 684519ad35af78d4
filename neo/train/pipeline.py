"""Training loops: the pipelined one (three batches in flight) and the plain one.

Pipelined (:class:`TrainPipeline`), at step i::

    batch i+2   read by the loader's background thread, copied to the device here
    batch i+1   input_dist launched (lengths AlltoAll in flight); its ids AlltoAll launched
                once step i's pooled embeddings have arrived (``run_after_output``), not waited
    batch i     ids arrived; lookup -> output_dist launched -> bottom MLP -> wait -> top, backward

so the read and copy of i+2 and the input redistribution of i+1 overlap the compute of i, and
the pooled-embedding AlltoAll of i overlaps the bottom MLP (:class:`neo.train.step.DenseStep`).
Every collective is issued in the same order on every rank, so the arithmetic is exactly the
plain loop's (:class:`PlainLoop`): the test ``tests/train/test_trainer_pipeline.py`` checks that
losses and weights are bit-identical.

Each batch travels with the loader state recorded when it was handed out, so a checkpoint after
step i stores the position after batch i, not after the prefetched i+2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

__all__ = ["StepBatch", "TrainPipeline", "PlainLoop"]


@dataclass
class StepBatch:
    """A batch on the device with the loader state after it."""

    batch: Any
    """``data_pipeline.loader.Batch`` (dense, sparse, labels)."""
    loader_state: Dict[str, Any]
    """``loader.state_dict()`` right after this batch was handed out."""


StepFn = Callable[[StepBatch, Any], torch.Tensor]
"""``step_fn(step_batch, dist_batch) -> loss``: forward, backward, optimizer."""


def _to_device(sb: StepBatch, device: torch.device) -> StepBatch:
    if device.type == "cpu":
        return sb
    b = sb.batch
    moved = type(b)(b.dense.to(device, non_blocking=True), b.sparse.to(device, non_blocking=True),
                    b.labels.to(device, non_blocking=True))
    return StepBatch(moved, sb.loader_state)


class PlainLoop:
    """One batch at a time: read, redistribute (wait), compute."""

    def __init__(self, source: Iterator[StepBatch], sharded, step_fn: StepFn, device: torch.device, timers):
        self.source, self.sharded, self.step_fn, self.device, self.timers = source, sharded, step_fn, device, timers

    def step(self) -> Optional[Tuple[torch.Tensor, StepBatch]]:
        with self.timers("data"):
            sb = next(self.source, None)
            if sb is None:
                return None
            sb = _to_device(sb, self.device)
        with self.timers("input_dist"):
            dist_batch = self.sharded.input_dist(sb.batch.sparse).wait()
        return self.step_fn(sb, dist_batch), sb

    def drain(self) -> None:
        """Nothing in flight."""


class TrainPipeline:
    """Batches i+1 (input_dist launched) and i+2 (on device) in flight while step i computes."""

    def __init__(self, source: Iterator[StepBatch], sharded, step_fn: StepFn, device: torch.device, timers):
        self.source, self.sharded, self.step_fn, self.device, self.timers = source, sharded, step_fn, device, timers
        self._next: Optional[StepBatch] = None          # batch i+1
        self._next_dist = None                           # its input_dist awaitable
        self._after: Optional[StepBatch] = None          # batch i+2
        self._started = False

    def _read(self) -> Optional[StepBatch]:
        with self.timers("data"):
            sb = next(self.source, None)
            return None if sb is None else _to_device(sb, self.device)

    def _launch(self, sb: Optional[StepBatch]):
        if sb is None:
            return None
        with self.timers("input_dist"):
            aw = self.sharded.input_dist(sb.batch.sparse)
        # its ids AlltoAll goes out once the current step's pooled embeddings have arrived (under compute)
        self.sharded.run_after_output(aw.progress)
        return aw

    def step(self) -> Optional[Tuple[torch.Tensor, StepBatch]]:
        if not self._started:
            self._started = True
            self._next = self._read()
            self._next_dist = self._launch(self._next)
            self._after = self._read()
        if self._next is None:
            return None
        current, current_dist = self._next, self._next_dist
        with self.timers("input_dist"):
            dist_batch = current_dist.wait()                 # ids of batch i (second AlltoAll)
        self._next = self._after                             # batch i+1: redistribute under step i
        self._next_dist = self._launch(self._next)
        self._after = self._read()                           # batch i+2: read and copy
        return self.step_fn(current, dist_batch), current

    def drain(self) -> None:
        """Complete the in-flight input distribution (before other collectives, e.g. evaluation)."""
        if self._next_dist is not None:
            with self.timers("input_dist"):
                self._next_dist.wait()
