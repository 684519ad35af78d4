"""Streaming loader: Parquet shards -> batches of (dense, KeyedJaggedBatch, labels).

Sharding: the files (sorted by name when a directory is given) form one sequence of ``N``
samples; rank ``r`` of ``W`` owns the contiguous range ``[r*N//W, (r+1)*N//W)`` (sizes differ by
at most one), so one epoch over all ranks covers every sample exactly once.

Order: a rank's range is cut into windows of ``shuffle_window`` samples (``read_rows`` when not
shuffling), after a ramp: the first window of an epoch holds ``first_window`` samples and each
next one twice as many as the one before, until the full size (so the first batch waits for a
small read, not for a whole window); with ``shuffle`` each window is permuted by
``default_rng([seed, epoch, window])``.
Batches are consecutive ``batch_size`` samples of that order, across window and file boundaries;
the last batch of an epoch holds the remainder (dropped only with ``drop_last``).

Position: ``(epoch, samples of the rank's range already yielded in this epoch)``; ``state_dict()``
/ ``load_state_dict()`` save and restore it, and a restored loader yields exactly the samples an
uninterrupted one would have yielded next (the window containing the position is re-read and
re-permuted, its consumed part skipped).

A background thread builds batches and puts at most ``prefetch_batches`` of them in a queue
(pinned when CUDA is available); a second one reads (decodes) the next window's row groups while
the batches of the current one are made, and a shuffled window is gathered batch by batch, so
no window boundary stalls training. Memory: two windows of decoded samples.

Options and batches: :mod:`.loader_options`; producer threads: :mod:`.loader_threads` (both re-exported here).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from neo.sparse import KeyedJaggedBatch

from .loader_options import Batch, LoaderOptions
from .loader_threads import _producers, _producers_lock, _stop_producers, set_thread_nice, thread_nice  # noqa: F401
from .reader import first_id_out_of_range, list_parquet_files, load_arrow_conversions, table_to_columns, take_from_parts
from .schema import DataFileError, check_same_layout, read_meta
from .writer import Columns

__all__ = ["LoaderOptions", "Batch", "ParquetLoader", "list_parquet_files"]  # the last re-exported from .reader


class ParquetLoader:
    """Iterable over the batches of one epoch of this rank's shard; see the module docstring."""

    trace = None
    """A ``neo.train.trace.TraceRecorder`` (set by the trainer): batch making and reads become
    timeline spans. A class default, so that loaders built without this ``__init__`` have it."""
    _warm = None
    """(window, future, executor) of :meth:`warm_up`'s read, until an iteration takes it."""
    _left_running = None
    """The producer thread of an iteration closed early, left to finish the batch or window read it
    was making (nobody takes it) instead of being waited for by the close: a run that stops at its
    last step does not wait for a read-ahead. The next read waits for it (:meth:`_settle`)."""

    def __init__(self, paths: Union[str, Sequence[str]], options: Optional[LoaderOptions] = None) -> None:
        o = options or LoaderOptions()
        o.check()
        self.options = o
        self.files = list_parquet_files(paths)
        first_schema = pq.read_schema(self.files[0])
        self.meta = read_meta(first_schema, self.files[0])
        groups: List[Tuple[int, int, int]] = []  # (file index, row group, rows)
        for fi, f in enumerate(self.files):
            md = pq.ParquetFile(f).metadata
            schema = md.schema.to_arrow_schema()
            check_same_layout(schema, read_meta(schema, f), f, first_schema, self.meta, self.files[0])
            for g in range(md.num_row_groups):
                groups.append((fi, g, md.row_group(g).num_rows))
        self._groups = groups
        self._group_start = np.zeros(len(groups) + 1, np.int64)  # global index of each group's first row
        np.cumsum([g[2] for g in groups], out=self._group_start[1:])
        self.num_samples = int(self._group_start[-1])
        N, W, r = self.num_samples, o.world_size, o.rank
        self.shard_begin, self.shard_end = r * N // W, (r + 1) * N // W
        self.epoch = 0
        self.position = 0
        self.pin = torch.cuda.is_available() if o.pin_memory is None else o.pin_memory
        self._handle: Optional[Tuple[int, pq.ParquetFile]] = None  # the one open file
        self._cache: Optional[Tuple[int, Columns]] = None
        self._const: Dict[Tuple[int, str], torch.Tensor] = {}
        self._base_nice = thread_nice()      # the building thread's; the background threads stand below it
        load_arrow_conversions()

    # ----------------------------------------------------------------- bookkeeping
    @property
    def shard_size(self) -> int:
        return self.shard_end - self.shard_begin

    def __len__(self) -> int:
        """Batches in one full epoch of this rank."""
        n, b = self.shard_size, self.options.batch_size
        return n // b if self.options.drop_last else (n + b - 1) // b

    def state_dict(self) -> Dict[str, Any]:
        """Position after the last batch handed out (epoch, samples of this epoch)."""
        o = self.options
        return {"epoch": self.epoch, "position": self.position, "num_samples": self.num_samples,
                "rank": o.rank, "world_size": o.world_size, "seed": o.seed, "shuffle": o.shuffle,
                "shuffle_window": o.shuffle_window if o.shuffle else None,
                "first_window": self._ramp_first() if o.shuffle else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        o = self.options
        checked = [("num_samples", self.num_samples), ("rank", o.rank), ("world_size", o.world_size),
                   ("seed", o.seed), ("shuffle", o.shuffle), ("shuffle_window", o.shuffle_window if o.shuffle else None)]
        if o.shuffle:                        # unshuffled, the order is the files' whatever the windows' sizes
            checked.append(("first_window", self._ramp_first()))      # (states saved before held one there too)
        for k, mine in checked:
            if state.get(k) != mine:
                raise ValueError(f"loader state has {k}={state.get(k)!r}, this loader has {mine!r}")
        if not 0 <= state["position"] <= self.shard_size:
            raise ValueError(f"position {state['position']} outside this rank's {self.shard_size} samples")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch, self.position = int(epoch), 0

    # ----------------------------------------------------------------- reading
    def _read_group(self, gi: int) -> Columns:
        if self._cache is not None and self._cache[0] == gi:
            return self._cache[1]
        fi, g, _ = self._groups[gi]
        where = f"{self.files[fi]} row group {g}"
        try:                    # a file cut or a page corrupted since the loader was built: name it
            if self._handle is None or self._handle[0] != fi:
                self._handle = (fi, pq.ParquetFile(self.files[fi], memory_map=False))
            table = self._handle[1].read_row_group(g, use_threads=self.options.arrow_threads)
        except (OSError, pa.ArrowException) as e:     # pyarrow's messages have no path
            raise DataFileError(f"{where}: unreadable ({type(e).__name__}: {e})") from None
        cols = table_to_columns(table, self.meta, source=where)
        if self.options.id_limits is not None:
            bad = first_id_out_of_range(cols.sparse, self.options.id_limits)
            if bad is not None:
                raise self.options.id_error(where, self.meta.sparse_names, bad)
        self._cache = (gi, cols)
        return cols

    def decode_seconds(self) -> Tuple[float, int]:
        """(CPU seconds, rows) of decoding the row group this rank's shard begins in, as a window's
        read does: this process's CPU time (every thread's), after one untimed decode of the same
        group (file pages cached, allocator warm, as in a steady stream of windows). Call it with no
        iteration running (its reader thread would be counted)."""
        self._settle()
        gi = int(np.searchsorted(self._group_start, self.shard_begin, side="right")) - 1
        self._cache = None
        self._read_group(gi)
        self._cache = None
        t0 = time.process_time()
        self._read_group(gi)
        return time.process_time() - t0, int(self._groups[gi][2])

    def _read_range(self, a: int, b: int) -> List[Columns]:
        """Samples [a, b) of the global sequence, as one slice per row group."""
        parts = []
        gi = int(np.searchsorted(self._group_start, a, side="right")) - 1
        while a < b:
            g0, g1 = int(self._group_start[gi]), int(self._group_start[gi + 1])
            if g1 > a:
                cols = self._read_group(gi)
                parts.append(cols.slice(a - g0, min(b, g1) - g0))
                a = min(b, g1)
            gi += 1
        return parts

    def _window_rows(self) -> int:
        o = self.options
        return o.shuffle_window if o.shuffle else o.read_rows

    def _ramp_first(self) -> Optional[int]:
        """The first window's size where the windows ramp up (module docstring), else None."""
        first = int(self.options.first_window)
        return first if 0 < first < self._window_rows() else None

    def _ramp(self) -> List[int]:
        """Sizes of the ramp's windows (first, 2 first, ... below the full size)."""
        first, win, out = self._ramp_first(), self._window_rows(), []
        while first is not None and first < win:
            out.append(first)
            first *= 2
        return out

    def _window_span(self, k: int) -> Tuple[int, int]:
        """Positions [a, b) of window ``k`` in an epoch (b not clipped to the shard)."""
        ramp, win = self._ramp(), self._window_rows()
        if k < len(ramp):
            a = sum(ramp[:k])
            return a, a + ramp[k]
        a = sum(ramp) + (k - len(ramp)) * win
        return a, a + win

    def _window_at(self, pos: int) -> int:
        """The window that holds position ``pos``."""
        ramp, win = self._ramp(), self._window_rows()
        a = 0
        for k, n in enumerate(ramp):
            if pos < a + n:
                return k
            a += n
        return len(ramp) + (pos - a) // win

    def _read_window(self, k: int) -> Tuple[List[Columns], int]:
        """Window ``k`` of this rank's shard: its row-group slices and its sample count."""
        a, b = self._window_span(k)
        b = min(self.shard_size, b)
        return self._read_range(self.shard_begin + a, self.shard_begin + b), b - a

    def _next_start(self) -> int:
        """The position the next iteration starts at (0 when the current epoch is done)."""
        left = self.shard_size - self.position
        if self.position > 0 and (left == 0 or (self.options.drop_last and left < self.options.batch_size)):
            return 0
        return self.position

    def warm_up(self) -> None:
        """Start reading the window the next iteration begins with, now, in the background.

        The first batch of an iteration waits for its whole window (a shuffle window of 262,144
        multi-hot samples is seconds of Parquet decoding); the trainer calls this before it plans
        and builds the model, so that the read overlaps them. The next iteration takes the read
        if it starts in that window, else drops it. Reads stay one at a time."""
        if self._warm is not None or self.shard_size == 0:
            return
        self._settle()
        k = self._window_at(self._next_start())
        ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-data-warm", initializer=self._give_way)
        self._warm = (k, ex.submit(self._read_window, k), ex)

    def _windows(self, epoch: int, start: int) -> Iterator[Tuple[int, Callable[[int, int], Columns]]]:
        """The rank's samples from position ``start`` on, in epoch order, as consecutive blocks:
        (rows, take) with ``take(i, j)`` the block's rows i..j-1. A shuffled window is not
        gathered up front: each batch takes its rows from the window's row groups."""
        k = self._window_at(start)
        skip = start - self._window_span(k)[0]
        warm, self._warm = self._warm, None
        if warm is not None:                        # its thread ends once its read is done
            warm[2].shutdown(wait=warm[0] != k, cancel_futures=True)

        # The next window is read (Arrow decodes without the GIL) while this one's batches are made.
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-data-read", initializer=self._give_way)
        read = self._read_window if self.trace is None else self.trace.wrap(self._read_window, "read", "reader")
        if warm is not None and warm[0] == k:
            ahead = warm[1]
        else:
            ahead = reader.submit(read, k) if self._window_span(k)[0] < self.shard_size else None
        try:
            while ahead is not None:
                parts, size = ahead.result()
                ahead = reader.submit(read, k + 1) if self._window_span(k + 1)[0] < self.shard_size else None
                yield from self._window_blocks(parts, size, epoch, k, skip)
                skip = 0
                k += 1
        finally:
            reader.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Wait for the background reader an iteration stopped early left running, and for a
        :meth:`warm_up` read no iteration took (its thread and window go) (call it after closing
        the iterator, before the process exits: a reader thread still inside pyarrow at
        interpreter shutdown aborts the process). Iterating again later is fine."""
        self._settle()
        warm, self._warm = self._warm, None
        if warm is not None:
            warm[2].shutdown(wait=True, cancel_futures=True)

    def _settle(self) -> None:
        """Reads stay one at a time: wait for the producer an earlier iteration left running."""
        th, self._left_running = self._left_running, None
        if th is not None:
            th.join()

    def _window_blocks(self, parts: List[Columns], size: int, epoch: int, k: int, skip: int):
        """Window ``k``'s blocks (see :meth:`_windows`), its first ``skip`` samples left out."""
        if self.options.shuffle:
            order = np.random.default_rng([self.options.seed, epoch, k]).permutation(size)[skip:]
            yield len(order), (lambda i, j: take_from_parts(parts, order[i:j]))
            return
        for cols in parts:
            if skip >= len(cols):
                skip -= len(cols)
                continue
            cols = cols.slice(skip, len(cols)) if skip else cols
            yield len(cols), cols.slice
            skip = 0

    # ----------------------------------------------------------------- batches
    def _const_tensor(self, key: Tuple[int, str], make) -> torch.Tensor:
        t = self._const.get(key)
        if t is None:
            t = make()
            if self.pin:
                t = t.pin_memory()
            self._const[key] = t
        return t

    def _to_batch(self, cols: Columns) -> Batch:
        B = len(cols)
        F = len(cols.sparse)
        if all(not isinstance(s, tuple) and s.ndim == 1 for s in cols.sparse):
            values = np.stack(cols.sparse).reshape(-1)  # (F * B,) feature-major
            lengths = self._const_tensor((B, "len1"), lambda: torch.ones(F * B, dtype=torch.int64))
            offsets = self._const_tensor((B, "off1"), lambda: torch.arange(F * B + 1, dtype=torch.int64))
        else:
            vals, lens = [], []
            fixed = True
            for s in cols.sparse:
                if isinstance(s, tuple):
                    fixed = False
                    vals.append(s[0])
                    lens.append(np.diff(s[1]))
                else:
                    k = 1 if s.ndim == 1 else s.shape[1]
                    vals.append(s.reshape(-1))
                    lens.append(np.full(B, k, np.int64))
            values = np.concatenate(vals)  # (N,)
            if fixed:
                lengths = self._const_tensor((B, "lenk"), lambda: torch.from_numpy(np.concatenate(lens)))
                offsets = self._const_tensor((B, "offk"), lambda: torch.from_numpy(
                    np.concatenate([[0], np.cumsum(np.concatenate(lens))]).astype(np.int64)))
            else:
                ln = np.concatenate(lens).astype(np.int64)
                off = np.zeros(len(ln) + 1, np.int64)
                np.cumsum(ln, out=off[1:])
                lengths, offsets = torch.from_numpy(ln), torch.from_numpy(off)
        dense_np = np.ascontiguousarray(cols.dense, dtype=np.float32)  # (B, D)
        if not dense_np.flags.writeable:  # a view of Arrow's (read-only) buffer
            dense_np = dense_np.copy()
        dense = torch.from_numpy(dense_np)
        labels = torch.from_numpy(cols.label.astype(np.float32))
        values_t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        if self.pin:
            dense, labels, values_t = dense.pin_memory(), labels.pin_memory(), values_t.pin_memory()
            if lengths.numel() and not lengths.is_pinned():
                lengths, offsets = lengths.pin_memory(), offsets.pin_memory()
        kjb = KeyedJaggedBatch(keys=tuple(self.meta.sparse_names), values=values_t, lengths=lengths,
                               batch_size=B, offsets=offsets, validate=False)
        return Batch(dense, kjb, labels)

    def _batches(self, epoch: int, start: int) -> Iterator[Tuple[Batch, int]]:
        """(batch, position after it) from ``start`` to the end of the epoch."""
        B = self.options.batch_size
        pending: List[Columns] = []
        have = 0
        pos = start
        for n, rows in self._windows(epoch, start):
            off = 0
            if have and have + n >= B:  # complete the pending batch
                take = B - have
                batch = Columns.concat(pending + [rows(0, take)])
                pending, have, off = [], 0, take
                pos += B
                yield self._to_batch(batch), pos
            while n - off >= B:
                pos += B
                yield self._to_batch(rows(off, off + B)), pos
                off += B
            if off < n:
                pending.append(rows(off, n))
                have += n - off
        if have and not self.options.drop_last:
            pos += have
            yield self._to_batch(Columns.concat(pending)), pos

    def __iter__(self) -> Iterator[Batch]:
        """Batches from the current position to the end of the epoch; then the next epoch begins.

        A position at the end of an epoch (nothing, or under ``drop_last`` less than a batch, left)
        means that epoch is done: iteration starts with the next one."""
        left = self.shard_size - self.position
        if self.position > 0 and (left == 0 or (self.options.drop_last and left < self.options.batch_size)):
            self.epoch, self.position = self.epoch + 1, 0
        epoch, start = self.epoch, self.position
        if self.options.prefetch_batches <= 0:
            source: Iterator[Tuple[Batch, int]] = self._batches(epoch, start)
            for batch, pos in source:
                self.position = pos
                yield batch
        else:
            yield from self._iter_threaded(epoch, start)
        if self.epoch == epoch:
            self.epoch, self.position = epoch + 1, 0

    def _give_way(self) -> None:
        """Put the calling (background) thread ``options.thread_nice`` below the thread that built
        the loader (:attr:`LoaderOptions.thread_nice`)."""
        if self.options.thread_nice and self._base_nice is not None:
            set_thread_nice(min(19, self._base_nice + self.options.thread_nice))

    def _iter_threaded(self, epoch: int, start: int) -> Iterator[Batch]:
        q: "queue.Queue[Any]" = queue.Queue(maxsize=self.options.prefetch_batches)
        stop = threading.Event()
        done = object()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            self._give_way()
            try:
                batches = self._batches(epoch, start)
                for item in (batches if self.trace is None else self.trace.iterate(batches, "load", "loader")):
                    if not put(item):
                        return
                put(done)
            except BaseException as e:  # handed to the consumer
                put(e)
            finally:
                with _producers_lock:
                    _producers.pop(threading.current_thread(), None)

        self._settle()
        th = threading.Thread(target=produce, name="neo-data-loader", daemon=True)
        with _producers_lock:
            _producers[th] = stop
        th.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                batch, pos = item
                self.position = pos
                yield batch
        finally:
            stop.set()         # the producer stops at its next put; one waiting for room wakes now
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
            self._left_running = th   # not joined here: it may be in a window read nobody needs
