"""Training loops: the pipelined one (three batches in flight) and the plain one.

Pipelined (:class:`TrainPipeline`), at step i::

    batch i+2   read by the loader's background thread, copied to the device here
    batch i+1   input_dist launched (lengths AlltoAll in flight); its ids AlltoAll launched
                once step i's pooled embeddings have arrived (``run_after_output``), not waited
    batch i     ids arrived; lookup -> output_dist launched -> bottom MLP -> wait -> top, backward

so the read and copy of i+2 and the input redistribution of i+1 overlap the compute of i, and
the pooled-embedding AlltoAll of i overlaps the bottom MLP (:class:`neo.train.step.DenseStep`).
Every collective is issued in the same order on every rank, so the arithmetic is exactly the
plain loop's (:class:`PlainLoop`): ``tests/train/test_trainer.py::test_pipelined_equals_plain`` checks that
losses and weights are bit-identical.

Each batch travels with the loader state recorded when it was handed out, so a checkpoint after
step i stores the position after batch i, not after the prefetched i+2.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

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
    """Batches read, redistributed and (with cached tables) prefetched ahead of the step computing.

    ``ahead`` is how many batches beyond the current one have finished their input
    distribution when a step starts (0 without cached tables: batch i+1's is in flight under
    step i, as in the module docstring). With cached tables, ``ahead = 1 + lookahead``: at
    step i the ids of batch i+1 are on the rank that holds each shard, and
    ``prefetch(dist_i+1, future=[dist_i+2, ...])`` makes its rows resident while step i
    computes (:meth:`neo.distributed.ShardedEmbeddingCollection.prefetch`), with the lookahead
    policy seeing the ``ahead - 1`` batches after it. Collectives are issued in the same order
    on every rank whatever ``ahead`` is, and the arithmetic stays the plain loop's.
    """

    def __init__(self, source: Iterator[StepBatch], sharded, step_fn: StepFn, device: torch.device, timers,
                 ahead: int = 0, prefetch: Optional[Callable[[Any, List[Any]], None]] = None):
        self.source, self.sharded, self.step_fn, self.device, self.timers = source, sharded, step_fn, device, timers
        self.ahead, self.prefetch = ahead, prefetch
        self._ready: Deque[Tuple[StepBatch, Any]] = deque()    # input_dist done: batches i .. i + ahead
        self._launched: Optional[Tuple[StepBatch, Any, Any]] = None  # input_dist in flight (ids sent under a step)
        self._after: Optional[StepBatch] = None                  # read and copied, not yet redistributed
        self._started = False

    def _read(self) -> Optional[StepBatch]:
        with self.timers("data"):
            sb = next(self.source, None)
            return None if sb is None else _to_device(sb, self.device)

    def _launch_next(self) -> None:
        """Launch the input distribution of the batch read ahead, and read the one after it."""
        if self._launched is not None or self._after is None:
            return
        sb = self._after
        with self.timers("input_dist"):
            aw = self.sharded.input_dist(sb.batch.sparse)
        # its ids AlltoAll goes out once the current step's pooled embeddings have arrived (under compute)
        self.sharded.run_after_output(aw.progress)
        self._launched = (sb, aw, self.timers.begin("input_dist", "input_dist"))   # timeline: in flight
        self._after = self._read()

    def _complete_launched(self) -> None:
        sb, aw, in_flight = self._launched
        self._launched = None
        with self.timers("input_dist"):
            self._ready.append((sb, aw.wait()))
        self.timers.end(in_flight)

    def step(self) -> Optional[Tuple[torch.Tensor, StepBatch]]:
        if not self._started:
            self._started = True
            self._after = self._read()
        while len(self._ready) <= self.ahead:                 # batches i .. i + ahead redistributed
            self._launch_next()
            if self._launched is None:
                break                                          # the data has ended
            self._complete_launched()
        if not self._ready:
            return None
        current, dist_batch = self._ready.popleft()
        self._launch_next()                                    # batch i + ahead + 1: redistributed under step i
        if self.prefetch is not None and self._ready:          # batch i + 1's rows: resident under step i
            nxt = [d for _, d in self._ready]
            self.prefetch(nxt[0], nxt[1:])
        return self.step_fn(current, dist_batch), current

    def drain(self) -> None:
        """Complete the in-flight input distribution (before other collectives, e.g. evaluation)."""
        if self._launched is not None:
            self._complete_launched()
