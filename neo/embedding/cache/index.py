"""The cache's bookkeeping without data: which row sits in which slot, and which rows make room.

Fully associative: any row may take any of the ``C`` slots, so there are no conflict misses
(FBGEMM's GPU cache is 32-way set-associative; ``neo cache-report --ways 32`` shows what that
costs). Two arrays map both ways::

    slot_of_row   (N,) int32   slot holding row r, -1 when r is not cached
    row_of_slot   (C,) int64   row held by slot s, -1 when s is free
    key           (C,) int64   slot s's eviction key outside any window: the number of the last
                               batch that needed it (lru), with the row's count above it (lfu, lookahead)
    count         (N,) int32   batches that asked for row r so far (lfu and lookahead only)

Every admitted batch gets a number ``seq`` (1, 2, ...). A batch is *in flight* from its
admission until :meth:`CacheIndex.complete` says the step using it is done (its fused
backward ran, or its forward under ``no_grad``), in any order. A slot needed by a batch in
flight is *pinned*: never evicted. So the prefetch of batch i+1, running while
step i computes, can evict neither a row step i reads and updates nor one batch i+1 needs.

Policies pick victims among unpinned slots by a key, smallest first (equal keys: lowest row first):

- ``lru``: ``last_use``.
- ``lfu``: ``(count, last_use)``.
- ``lookahead``: Belady's rule within the window of future batches the caller passes: rows no
  batch of the window needs first (by ``(count, last_use)``), then the row needed farthest
  ahead. With an empty window it is ``lfu``.

Example: C = 2, rows 0..9, lru. Batch 1 asks for [3, 5]: two misses fill the free slots 0, 1.
Batch 1 completes. Batch 2 asks for [5, 7]: 5 hits (slot 1); 7 misses and evicts row 3
(slot 0, last_use 1 < 2), so ``evicted_rows = [3]``, ``fill_slots = [0]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from neo.config.embedding import CachePolicy
from neo.cpp import cpu_kernels

__all__ = ["Admission", "CacheIndex", "CacheCapacityError"]

_COUNT_BITS = 24
_GROUP_SHIFT = 56
_PINNED = (1 << 63) - 1          # the key of slots that must not be evicted


class _Window:
    """Which of the next batches (at most 63) need each row: one bit per batch in a (N,) int64 mask.

    The window moves by a batch or so per admission: a batch entering sets its bit on its rows, a
    batch leaving clears it, so each admission costs two scatters of a batch's rows, and asking
    for the nearest batch that needs a few candidate rows is a gather of their masks."""

    MAX_BATCHES = 63

    def __init__(self, num_rows: int, device: torch.device, cpp: bool = False):
        self.mask = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self.bits: Dict[int, Tuple[torch.Tensor, int]] = {}       # id(rows tensor) -> (rows, bit)
        self.free_bits = list(range(self.MAX_BATCHES - 1, -1, -1))
        self.cpp = cpp                                              # the mask's moves in neo._C

    def update(self, future: Sequence[torch.Tensor]) -> None:
        keep = {id(f) for f in future}
        leave: List[Tuple[torch.Tensor, int]] = []
        for key, (rows, bit) in list(self.bits.items()):
            if key not in keep:                                     # admitted, or out of the window
                leave.append((rows, bit))
                self.free_bits.append(bit)
                del self.bits[key]
        enter: List[Tuple[torch.Tensor, int]] = []
        for f in future:
            if id(f) not in self.bits:
                bit = self.free_bits.pop()
                enter.append((f, bit))
                self.bits[id(f)] = (f, bit)
        if not (leave or enter):
            return
        if self.cpp:                                                # the same moves, row by row in C++
            cpu_kernels("cache_window_update").cache_window_update(
                self.mask, [r for r, _ in leave], [b for _, b in leave], [r for r, _ in enter], [b for _, b in enter])
            return
        for rows, bit in leave:                                     # every clear before any set: a bit
            self.mask[rows] &= ~(1 << bit)                          # freed here may be taken again below
        for rows, bit in enter:
            self.mask[rows] |= 1 << bit

    def groups(self, rows: torch.Tensor, future: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per row: 0 when no batch of ``future`` needs it, else ``k + 1 - d`` for the nearest
        batch ``d`` (1..k) that does (farther -> smaller)."""
        shifts = torch.arange(self.MAX_BATCHES, dtype=torch.int64, device=rows.device)
        bits = (self.mask[rows].unsqueeze(1) >> shifts) & 1                                     # (R, 63)
        return (bits * self.values(future).to(rows.device)).amax(dim=1) if rows.numel() else rows.new_zeros(0)

    def values(self, future: Sequence[torch.Tensor]) -> torch.Tensor:
        """(63,) int64 on the CPU: the group of each bit's batch (``k + 1 - d``), 0 for bits no batch holds."""
        k = len(future)
        value = [0] * self.MAX_BATCHES
        for d in range(1, k + 1):
            value[self.bits[id(future[d - 1])][1]] = k + 1 - d
        return torch.tensor(value, dtype=torch.int64)


class CacheCapacityError(RuntimeError):
    """A batch needs more rows than the cache can hold beside the rows pinned by batches in flight."""


@dataclass
class Admission:
    """What one admitted batch did to the cache (U unique rows, M misses, E evictions)."""

    seq: int
    rows: torch.Tensor           # (U,) int64, sorted unique rows the batch asked for
    slots: torch.Tensor          # (U,) int64, their slots now
    hits: int
    miss_rows: torch.Tensor      # (M,) int64
    fill_slots: torch.Tensor     # (M,) int64, where the missing rows go
    evicted_rows: torch.Tensor   # (E,) int64, rows that left (E <= M)
    evicted_slots: torch.Tensor  # (E,) int64, the slots they left (a subset of fill_slots)


class CacheIndex:
    """Slot map and eviction policy of one cached table; see the module docstring.

    Args:
        name: the table (named in every error).
        num_rows: N, rows of the table.
        capacity: C, slots of the cache (<= N).
        policy: lru, lfu or lookahead.
        device: where the arrays live (the cache's device).
        kernel: how batches are admitted: ``auto`` (``neo._C.cache_admit`` on the CPU where it is
            built, else ``reference``) or ``reference`` (torch operations, any device). The same
            slots either way (tested).
    """

    def __init__(self, name: str, num_rows: int, capacity: int, policy: CachePolicy,
                 device: torch.device | str = "cpu", kernel: str = "auto"):
        if not 0 < capacity <= num_rows:
            raise ValueError(f"table '{name}': cache capacity {capacity} must be in [1, {num_rows}]")
        if kernel not in ("auto", "reference"):
            raise ValueError(f"table '{name}': cache index kernel must be 'auto' or 'reference', got {kernel!r}")
        self.name, self.num_rows, self.capacity = name, num_rows, capacity
        self.policy = CachePolicy(policy)
        self.device = torch.device(device)
        self.slot_of_row = torch.full((num_rows,), -1, dtype=torch.int32, device=self.device)
        self.row_of_slot = torch.full((capacity,), -1, dtype=torch.int64, device=self.device)
        self.key = torch.full((capacity,), _PINNED, dtype=torch.int64, device=self.device)
        """Each slot's eviction key outside any window (see :meth:`_base_key`), kept up to date;
        never-used slots hold the largest key (they are taken from the free list, not evicted)."""
        self.count: Optional[torch.Tensor] = None
        if self.policy is not CachePolicy.LRU:
            self.count = torch.zeros(num_rows, dtype=torch.int32, device=self.device)
        self.seq = 0
        self._free = torch.arange(capacity, dtype=torch.int64, device=self.device)   # never-used slots
        self._in_flight: Dict[int, torch.Tensor] = {}          # seq -> the slots it pins
        self.cpp = kernel == "auto" and self.device.type == "cpu" and cpu_kernels("cache_admit") is not None
        """Whether admissions (and the window's moves) run in ``neo._C.cache_admit``."""
        self._window = _Window(num_rows, self.device, self.cpp) if self.policy is CachePolicy.LOOKAHEAD else None

    # ------------------------------------------------------------------ batches in flight
    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def complete(self, seq: int) -> None:
        """The step that used batch ``seq`` is done: its rows may be evicted again."""
        self._in_flight.pop(seq, None)

    # ------------------------------------------------------------------ admission
    def _base_key(self, rows: torch.Tensor, seq: int) -> torch.Tensor:
        """lru: the batch number; lfu, lookahead: (count << 32) | batch number."""
        if self.count is None:
            return torch.full_like(rows, seq)
        return (self.count[rows].to(torch.int64).clamp_(max=(1 << _COUNT_BITS) - 1) << 32) | seq

    def admit(self, rows: torch.Tensor, future: Sequence[torch.Tensor] = ()) -> Admission:
        """Make every row of ``rows`` (sorted, unique, in [0, N)) resident; the batch stays in flight.

        ``future``: sorted unique rows of the next batches, nearest first (the lookahead window).
        Work per batch: O(distinct rows) index updates, and O(C) for choosing victims.
        """
        self.seq += 1
        seq = self.seq
        rows = rows.to(device=self.device, dtype=torch.int64)
        future = [f for f in future if f.numel()][:_Window.MAX_BATCHES]
        if self._window is not None:
            future = [f.to(device=self.device, dtype=torch.int64) for f in future]
            self._window.update(future)
        if self.cpp:
            return self._admit_cpp(seq, rows, future)
        if self.count is not None:
            self.count[rows] += 1
        slots = self.slot_of_row[rows].to(torch.int64)                       # (U,)
        hit = slots >= 0
        self._in_flight[seq] = slots[hit]                                    # pinned from here on
        miss_rows = rows[~hit]
        M = int(miss_rows.numel())
        empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        evicted_slots, fill = empty, empty
        if M:
            free, self._free = self._free[:M], self._free[M:]
            need = M - int(free.numel())
            if need > 0:
                try:
                    evicted_slots = self._victims(need, future, int(rows.numel()), M)
                except CacheCapacityError:
                    self._free = torch.cat([free, self._free])
                    self.complete(seq)                          # the failed batch pins nothing
                    raise
            fill = torch.cat([free, evicted_slots])                          # (M,)
        evicted_rows = self.row_of_slot[evicted_slots]
        self.slot_of_row[evicted_rows] = -1
        self.row_of_slot[fill] = miss_rows
        self.slot_of_row[miss_rows] = fill.to(torch.int32)
        slots[~hit] = fill
        self.key[slots] = self._base_key(rows, seq)
        self._in_flight[seq] = slots
        return Admission(seq, rows, slots, int(rows.numel()) - M, miss_rows, fill, evicted_rows, evicted_slots)

    def _victims(self, need: int, future: Sequence[torch.Tensor], unique: int, missing: int) -> torch.Tensor:
        """The ``need`` evictable slots with the smallest ``(group << 56 | key, row)``: group 0 for
        rows no batch of the lookahead window needs, else ``k + 1 - d`` for the nearest batch d
        that does (lookahead with a window only). Below the cut in slot order, then ties by row."""
        key = self._evictable_keys()
        evictable = self.capacity - int((key == _PINNED).sum())
        if evictable < need:
            raise self._capacity_error(unique, missing, missing - need, evictable, self.in_flight - 1)
        if self.policy is not CachePolicy.LOOKAHEAD or not future:
            return self._smallest(key, torch.arange(self.capacity, device=self.device), need)
        # Lookahead: the rows the window needs go last. Only the slots with the smallest keys
        # can be evicted: look those up in the window, widening the look until `need` of them are
        # needed by no batch of it. Exact: the candidates are every slot whose key is at most the
        # m-th smallest (ties included), so a slot left out has a larger key than any looked at.
        m = min(evictable, 2 * need)
        while True:
            cut = torch.topk(key, m, largest=False, sorted=False).values.max()
            cand = torch.nonzero(key <= cut).flatten()
            group = self._window.groups(self.row_of_slot[cand], future)
            if m == evictable or int((group == 0).sum()) >= need:
                break
            m = min(evictable, 2 * m)
        return self._smallest((group << _GROUP_SHIFT) | key[cand], cand, need)

    def _capacity_error(self, unique: int, missing: int, free: int, evictable: int, others: int) -> CacheCapacityError:
        return CacheCapacityError(
            f"table '{self.name}': a batch needs {unique} distinct rows, {missing} of them not cached, but "
            f"the cache of {self.capacity} rows has {free} free and {evictable} evictable: "
            f"{self.capacity - free - evictable} are pinned by {others} other batch(es) in flight "
            f"and this batch's hits. Raise cache_rows / cache_load_factor to at least twice a batch's "
            f"distinct rows (the step computing and the batch prefetched under it)")

    def _admit_cpp(self, seq: int, rows: torch.Tensor, future: Sequence[torch.Tensor]) -> Admission:
        """:meth:`admit` after the window's update, in ``neo._C.cache_admit`` (the same result)."""
        windowed = self.policy is CachePolicy.LOOKAHEAD and bool(future)
        pinned = torch.cat(list(self._in_flight.values())) if self._in_flight else self._free[:0]
        kernels = cpu_kernels("cache_admit")
        slots, miss_rows, fill, evicted_rows, evicted_slots, hits, taken, evictable = kernels.cache_admit(
            rows.contiguous(), seq, self.slot_of_row, self.row_of_slot, self.key, self.count, self._free, pinned,
            self._window.mask if windowed else None, self._window.values(future) if windowed else None)
        M = int(miss_rows.numel())
        free = min(M, int(self._free.numel()))
        if M - free > evictable:
            raise self._capacity_error(int(rows.numel()), M, free, evictable, self.in_flight)
        self._free = self._free[taken:]
        self._in_flight[seq] = slots
        return Admission(seq, rows, slots, hits, miss_rows, fill, evicted_rows, evicted_slots)

    def _smallest(self, key: torch.Tensor, slots: torch.Tensor, need: int) -> torch.Tensor:
        """The ``need`` slots of ``slots`` with the smallest ``key``; among equal keys at the cut,
        the lowest rows (deterministic)."""
        if need == slots.numel():
            return slots
        cut = torch.topk(key, need, largest=False, sorted=False).values.max()
        below = torch.nonzero(key < cut).flatten()
        ties = torch.nonzero(key == cut).flatten()
        take = need - int(below.numel())
        if take < ties.numel():
            ties = ties[torch.sort(self.row_of_slot[slots[ties]]).indices[:take]]
        return slots[torch.cat([below, ties])]

    def _evictable_keys(self) -> torch.Tensor:
        """(C,) base keys, with slots pinned by a batch in flight, or never used, at the largest key."""
        key = self.key.clone()
        if self._in_flight:
            key[torch.cat(list(self._in_flight.values()))] = _PINNED
        return key

    def eviction_key(self, future: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """(C,) int64 key of every slot under the policy, the smallest evicted first (see the module
        docstring); pinned and never-used slots get the largest key. For inspection and tests: the
        eviction itself looks at the slots with the smallest base keys only."""
        key = self._evictable_keys()
        if self.policy is CachePolicy.LOOKAHEAD and future:
            self._window.update(future)
            open_ = key != _PINNED
            key[open_] |= self._window.groups(self.row_of_slot[open_], future) << _GROUP_SHIFT
        return key

    # ------------------------------------------------------------------ maintenance
    def clear(self) -> None:
        """Forget every cached row (the data must have been written back)."""
        if self._in_flight:
            raise RuntimeError(f"table '{self.name}': cannot drop the cache with {self.in_flight} batch(es) in flight")
        self.slot_of_row.fill_(-1)
        self.row_of_slot.fill_(-1)
        self.key.fill_(_PINNED)
        self._free = torch.arange(self.capacity, dtype=torch.int64, device=self.device)
        if self._window is not None:
            self._window.update([])

    def resident_rows(self) -> torch.Tensor:
        """(rows, slots) of every occupied slot."""
        slots = torch.nonzero(self.row_of_slot >= 0).flatten()
        return self.row_of_slot[slots], slots
