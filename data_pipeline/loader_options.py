"""Options of the Parquet loader (:class:`LoaderOptions`) and the batches it yields (:class:`Batch`).

:mod:`.loader` re-exports both (import them from there or from :mod:`data_pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from neo.sparse import KeyedJaggedBatch

from .schema import DataFileError


@dataclass
class LoaderOptions:
    """Options of :class:`.loader.ParquetLoader`."""

    batch_size: int = 4096
    """Samples per batch (the last batch of an epoch may hold fewer, see ``drop_last``)."""
    rank: int = 0
    """This process's rank."""
    world_size: int = 1
    """Number of ranks sharing the data."""
    shuffle: bool = False
    """Permute samples within windows of ``shuffle_window`` samples (seeded per epoch and window)."""
    shuffle_window: int = 262144
    """Samples per shuffle window (memory: one window of decoded samples)."""
    read_rows: int = 262144
    """Samples read per step when not shuffling."""
    first_window: int = 16384
    """Samples of an epoch's first window; the windows after it double up to the full size. The
    first batch of an epoch waits for its window's read: a full 262,144-sample window of the
    scaled MLPerf data (214 ids a sample) took 2.8 s, 67 ms a step over a 60-step run. 0 (or a
    size not below the full one): every window full-size."""
    seed: int = 0
    """Seed of the shuffle."""
    drop_last: bool = False
    """Drop the final partial batch of each epoch instead of yielding it."""
    prefetch_batches: int = 8
    """Batches the background thread may hold ready (0 = no background thread)."""
    pin_memory: Optional[bool] = None
    """Pin batch tensors; None = when CUDA is available."""
    arrow_threads: bool = False
    """Let Arrow decode a row group's columns with its own thread pool."""
    thread_nice: int = 10
    """How far the loader's background threads (the batch producer, the window reader) stand
    below the thread that built the loader in the scheduler's priority: Linux nice values, 0 to
    19 (0: the same). Training's own thread then keeps its core wherever the loader's threads
    and it want more cores than there are: on 2 cores, one rank, `zipf_mix` (169 ids a sample),
    the training thread lost 1.5-1.6 ms of an 11.3 ms step waiting for a core the producer held,
    and 0.24-0.26 ms with the producer at nice 10 (the loader kept up: its wait 0.05-0.07 ms;
    docs/benchmarks.md). Ignored where per-thread nice values do not exist (not Linux)."""
    id_limits: Optional[Sequence[Optional[int]]] = None
    """Per sparse column (the data's order): its ids must lie in ``[0, limit)`` (the rows of the
    table reading it; None: not checked), checked as each row group (MLPerf: each batch) is
    read; an id outside is a ``DataFileError`` naming the file, row, column, id and ``id_owners``."""
    id_owners: Optional[Sequence[str]] = None
    """Per sparse column, what reads it (e.g. ``table 't3'``), for those messages."""

    def check(self) -> None:
        """TypeError or ValueError naming the first option that is not an integer or out of range
        (every loader checks its options as it starts)."""
        for name in ("batch_size", "rank", "world_size", "shuffle_window", "read_rows", "first_window", "seed",
                     "prefetch_batches", "thread_nice"):        # 64.5 or "64" would fail later, far from here
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"LoaderOptions.{name} must be an integer, got {value!r} ({type(value).__name__})")
        if not (0 <= self.rank < self.world_size):
            raise ValueError(f"LoaderOptions.rank {self.rank} not in [0, world_size = {self.world_size})")
        if self.batch_size <= 0:
            raise ValueError(f"LoaderOptions.batch_size must be > 0, got {self.batch_size}")
        for name in ("shuffle_window", "read_rows"):           # a window of 0 or less never advances
            if getattr(self, name) <= 0:
                raise ValueError(f"LoaderOptions.{name} must be > 0, got {getattr(self, name)}")
        for name in ("first_window", "prefetch_batches"):
            if getattr(self, name) < 0:
                raise ValueError(f"LoaderOptions.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.thread_nice <= 19:
            raise ValueError(f"LoaderOptions.thread_nice must be in [0, 19], got {self.thread_nice}")
        if self.id_owners is not None and (self.id_limits is None or len(self.id_owners) != len(self.id_limits)):
            raise ValueError("LoaderOptions.id_owners: one per id_limits entry")

    def id_error(self, where: str, names: Sequence[str], found: Tuple[int, int, int]) -> DataFileError:
        """The message of an id outside its column's limit: ``found`` = (column, row, id) at ``where``."""
        f, row, value = found
        owner = f" of {self.id_owners[f]}" if self.id_owners is not None else ""
        return DataFileError(f"{where}: column {names[f]!r} row {row}: id {value} is outside [0, "
                             f"{self.id_limits[f]}){owner} (num_rows)")


@dataclass
class Batch:
    """One training batch."""

    dense: torch.Tensor  # (B, D) float32
    sparse: KeyedJaggedBatch  # F features, feature-major
    labels: torch.Tensor  # (B,) float32

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])
