"""Prefetching for every cached table of one embedding module, on a worker thread.

The training pipeline knows batch i+1's ids while step i computes (and, with a lookahead
window, those of the batches after it). ``prefetch_async(batch_i+1, future=[...])`` makes its
rows resident on the module's worker thread (a side CUDA stream on a GPU) under step i;
the lookup of batch i+1 then ``take``s the result, waiting only for what was not hidden
(``CacheStats.exposed_s``). A lookup whose batch was not prefetched does it then and there.
Every cache operation runs on that one worker, in submission order, so the index is never
touched by two threads; slots pinned by batches in flight are never evicted (see
:mod:`neo.embedding.cache.index`), so the moves are safe while a step computes on other slots.

A prefetched batch stays in flight until :meth:`ModuleCache.complete` (called by the fused
backward, or after a ``no_grad`` forward).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from neo.cpp import cpu_kernels
from neo.embedding.cache.store import HostStore
from neo.embedding.cache.table_cache import CacheStats, TableCache
from neo.sparse import KeyedJaggedBatch

__all__ = ["ModuleCache", "Prefetched", "distinct_rows"]

_MEMO = 66                       # batches whose distinct rows are kept: the window (<= 63) and two more


@dataclass
class Prefetched:
    """A batch whose cached rows are resident: its slot ids, per cached feature, and batch numbers."""

    seqs: Dict[str, int]                                   # cached table -> seq of this batch there
    slots: Dict[str, torch.Tensor]                         # cached feature -> slot of each of its ids
    train: bool
    done_event: Optional[object] = None                    # CUDA event of the moves (GPU)
    completed: set = field(default_factory=set)

    def substitute(self, batch: KeyedJaggedBatch, values: torch.Tensor) -> torch.Tensor:
        """``values`` (int64, ``batch``'s layout) with every cached feature's ids replaced by slots."""
        out = values.clone()
        starts = batch.offset_per_key()
        for f, key in enumerate(batch.keys):
            s = self.slots.get(key)
            if s is not None:
                out[starts[f]:starts[f + 1]] = s
        return out


class ModuleCache:
    """The cached tables of one module (see the module docstring).

    Args:
        caches: table name -> its :class:`TableCache`.
        table_features: table name -> features reading it.
    """

    def __init__(self, caches: Dict[str, TableCache], table_features: Dict[str, Sequence[str]]):
        self.caches = caches
        self.table_features = {t: list(table_features[t]) for t in caches}
        self.device = next(iter(caches.values())).weights.device
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-cache")
        self._pending: "OrderedDict[int, Tuple[KeyedJaggedBatch, Future, tuple]]" = OrderedDict()
        self._rows_memo: "OrderedDict[int, Tuple[KeyedJaggedBatch, Dict[str, torch.Tensor]]]" = OrderedDict()
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._completed: List[Tuple[str, int]] = []
        moves = next(iter(caches.values())).moves
        self._interpreted = moves.name == "triton" and os.environ.get("TRITON_INTERPRET") == "1"
        self.trace = None                  # a neo.train.trace.TraceRecorder: prefetches become timeline spans

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict:
        """What ``copy.deepcopy``, pickling and ``torch.save`` of the module keep: the caches
        (slots, index, backing rows) without the worker thread, the side stream or the memo.
        Refused, naming the tables, where the copy could not be independent: rows in a file
        (``mmap`` stores), or a batch in flight (prefetched or looked up, its backward not yet run:
        the copy would keep its slots pinned, with no backward to release them). The slots' views
        of the module's buffers are bound again by the module as it loads (``rebind``)."""
        in_files = [t for t, c in self.caches.items() if not isinstance(c.store, HostStore)]
        if in_files:
            raise TypeError(f"cached tables {in_files} keep their rows in files (cache_store 'mmap'): a module "
                            f"holding them cannot be copied or pickled; save its state_dict() and load it into a "
                            f"new module instead")
        flying = self.in_flight
        if flying:
            raise TypeError(f"cached tables {list(self.caches)}: {flying} batch(es) in flight (prefetched or looked "
                            f"up, their backward not yet run); copy or pickle the module between steps")
        state = dict(self.__dict__)
        state.update(_worker=None, _pending=OrderedDict(), _rows_memo=OrderedDict(), _stream=None, trace=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.device = next(iter(self.caches.values())).weights.device     # where the load put the slots
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-cache")
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def rebind(self, slots: Dict[str, Tuple[torch.Tensor, List[torch.Tensor]]]) -> None:
        """Each table's slots as views of the module's buffers again (table -> (weights, states)):
        plain ``pickle`` (unlike ``torch.save`` and ``copy.deepcopy``) loads views as tensors of
        their own, which the kernels would never read. On a GPU, host stores are pinned again."""
        for t, (weights, states) in slots.items():
            cache = self.caches[t]
            cache.weights, cache.states = weights, list(states)
            store = cache.store
            if self.device.type == "cuda" and not store.weights.is_pinned():
                store.weights = store.weights.pin_memory()
                store.states = [s.pin_memory() for s in store.states]

    # ------------------------------------------------------------------ rows of a batch
    def _rows(self, batch: KeyedJaggedBatch,
              check: bool = True) -> Dict[str, Tuple[torch.Tensor, torch.Tensor, List[int]]]:
        """Per cached table of ``batch``: (sorted distinct valid ids, for every id of its features
        the position of its row among them (-1: invalid id), each feature's id count). Memoized: a
        batch is first seen in the lookahead window, then prefetched. ``check``: a memoized batch
        whose ids or lengths were written in place since is done again. The window's batches are
        looked up without it (a stamp each, for up to 63 of them per prefetch): rows out of
        date there only make the eviction choice worse for a batch, never its own prefetch wrong."""
        hit = self._rows_memo.get(id(batch))
        if hit is not None and hit[0] is batch and not check:
            return hit[1]
        stamp = _stamp(batch)
        if hit is not None and hit[0] is batch and _same(hit[2], stamp):
            return hit[1]
        out = {}
        for t, feats in self.table_features.items():
            parts = [batch.feature(f)[0] for f in feats if f in batch.keys]
            ids = (torch.cat(parts) if len(parts) > 1 else parts[0]).to(device=self.device, dtype=torch.int64)
            rows, where = distinct_rows(ids, self.caches[t].cfg.num_rows)
            out[t] = (rows, where, [int(p.numel()) for p in parts])
        self._rows_memo[id(batch)] = (batch, out, stamp)
        while len(self._rows_memo) > _MEMO:
            self._rows_memo.popitem(last=False)
        return out

    def _run(self, batch: KeyedJaggedBatch, future: Sequence[KeyedJaggedBatch], train: bool,
             launched: Optional[object], completed: List[Tuple[str, int]]) -> Prefetched:
        for t, seq in completed:                     # steps finished before this launch: unpin
            self.caches[t].complete(seq)
        if self._stream is not None:
            ctx = torch.cuda.stream(self._stream)
            self._stream.wait_event(launched)        # after every step queued before the launch
        else:
            ctx = _NullContext()
        with ctx:
            rows = self._rows(batch)
            ahead = [self._rows(b, check=False) for b in future]
            seqs, slots = {}, {}
            try:
                for t, cache in self.caches.items():
                    window = [a[t][0] for a in ahead] if cache.cfg.cache_lookahead else []
                    distinct, where, counts = rows[t]
                    seqs[t], row_slots = cache.prefetch(distinct, window[:cache.cfg.cache_lookahead], train=train)
                    per_id = cache.moves.take(row_slots, where)          # slot of every id, -1 for invalid ids
                    feats = [f for f in self.table_features[t] if f in batch.keys]
                    for f, s in zip(feats, torch.split(per_id, counts)):
                        slots[f] = s
            except BaseException:
                for t, seq in seqs.items():       # a table that could not take the batch (a cache too small):
                    self.caches[t].complete(seq)  # the others' rows of it are not left pinned
                raise
            done = None
            if self._stream is not None:
                done = torch.cuda.Event()
                done.record(self._stream)
        return Prefetched(seqs, slots, train, done)

    # ------------------------------------------------------------------ public
    def _submit(self, batch: KeyedJaggedBatch, future: Sequence[KeyedJaggedBatch], train: bool) -> Future:
        """Queue a prefetch on the worker. Completions reported since the last launch go with it:
        the rows of steps finished before this point may be evicted, those of later ones not (on
        a GPU the moves also wait for every kernel queued so far), whatever the threads' timing."""
        launched = None
        if self._stream is not None:
            launched = torch.cuda.Event()
            launched.record()
        completed, self._completed = self._completed, []
        run = self._run if self.trace is None else self.trace.wrap(self._run, "cache_prefetch", "cache")
        return self._worker.submit(run, batch, list(future), train, launched, completed)

    def prefetch_async(self, batch: KeyedJaggedBatch, future: Sequence[KeyedJaggedBatch] = (),
                       train: bool = True) -> None:
        """Start making ``batch``'s rows resident on the worker (``future``: the batches after it).

        Triton's interpreter (``TRITON_INTERPRET=1``, kernels on CPU tensors) cannot run kernels
        from two threads at once, so there the prefetch completes before this returns."""
        fut = self._submit(batch, future, train)
        if self._interpreted:
            fut.result()
        self._pending[id(batch)] = (batch, fut, _stamp(batch))

    def take(self, batch: KeyedJaggedBatch, train: bool) -> Prefetched:
        """The prefetched state of ``batch`` (waiting for it), or a prefetch done now: also where
        the batch's ids or lengths were changed in place since its prefetch (a loader reusing its
        buffers), whose prefetched rows are released."""
        entry = self._pending.pop(id(batch), None)
        t0 = time.perf_counter()
        if entry is not None and entry[0] is batch and _same(entry[2], _stamp(batch)):
            p = entry[1].result()
        else:
            if entry is not None and entry[0] is batch:          # prefetched, then refilled: those rows go
                self.complete(entry[1].result())
            p = self._submit(batch, [], train).result()
        waited = time.perf_counter() - t0
        for t in p.seqs:
            self.caches[t].stats.exposed_s += waited / len(p.seqs)
        if p.done_event is not None:
            torch.cuda.current_stream().wait_event(p.done_event)
        return p

    def complete(self, p: Prefetched, tables: Optional[Sequence[str]] = None) -> None:
        """The step that used ``p`` is done for ``tables`` (default: all): their rows may go once
        the next prefetch is launched."""
        for t in (p.seqs if tables is None else tables):
            if t in p.seqs and t not in p.completed:
                p.completed.add(t)
                self._completed.append((t, p.seqs[t]))

    def _apply_completions(self) -> None:
        completed, self._completed = self._completed, []

        def apply():
            for t, seq in completed:
                self.caches[t].complete(seq)
        self._worker.submit(apply).result()

    def wait_idle(self) -> None:
        """Wait for every prefetch in flight (they stay pending: their lookups take them later)."""
        for _, fut, _ in list(self._pending.values()):
            fut.result()

    def flush(self) -> int:
        """Write every dirty row of every cached table back to its store; returns the rows written."""
        self.wait_idle()
        n = sum(self._worker.submit(c.flush).result() for c in self.caches.values())
        if self._stream is not None:
            torch.cuda.synchronize(self.device)
        return n

    def drop(self) -> None:
        """Flush and forget every cached row (no batch may be in flight)."""
        self.wait_idle()
        self._apply_completions()
        for c in self.caches.values():
            self._worker.submit(c.drop).result()

    @property
    def in_flight(self) -> int:
        """Batches prefetched whose steps have not been reported done."""
        self.wait_idle()
        self._apply_completions()
        return max(c.index.in_flight for c in self.caches.values())

    def stats(self) -> Dict[str, CacheStats]:
        return {t: CacheStats(**vars(c.stats)) for t, c in self.caches.items()}

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        for c in self.caches.values():
            c.store.close()


def distinct_rows(ids: torch.Tensor, num_rows: int, kernel: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows, where) of a table's ids (1-D, any integer dtype): the distinct ids in [0, num_rows),
    ascending, and the position of each id's row among them (-1 for an id outside the table),
    both int64. ``kernel``: ``auto`` (``neo._C.unique_rows`` on the CPU where it is built: a radix
    sort; docs/cache.md) or ``reference`` (torch operations, any device). The same result either
    way (tested)."""
    ids = ids.to(torch.int64)
    kernels = cpu_kernels("unique_rows") if kernel == "auto" and ids.device.type == "cpu" else None
    if kernels is not None and num_rows <= 1 << 32 and ids.numel() < 1 << 32:
        return kernels.unique_rows(ids, num_rows)
    valid = (ids >= 0) & (ids < num_rows)
    if bool(valid.all()):
        return torch.unique(ids, sorted=True, return_inverse=True)
    rows, inv = torch.unique(ids[valid], sorted=True, return_inverse=True)
    where = torch.full_like(ids, -1)
    where[valid] = inv
    return rows, where


def _stamp(batch: KeyedJaggedBatch) -> tuple:
    """What a batch's rows depend on: its id and length tensors (the objects, and their version
    counters, which every in-place write advances: also a write to another view of the same
    buffer, which then costs a prefetch done again), its keys and batch size. Inference tensors
    (``torch.inference_mode``) keep no version counter and cannot be written in place outside it."""
    return (batch.values, _version(batch.values), batch.lengths, _version(batch.lengths), tuple(batch.keys),
            batch.batch_size)


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


def _same(a: tuple, b: tuple) -> bool:
    return a[0] is b[0] and a[1] == b[1] and a[2] is b[2] and a[3] == b[3] and a[4:] == b[4:]


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
