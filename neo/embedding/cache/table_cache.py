"""One cached table: its slots in the group's fast buffers, its backing store, and the moves between them.

The cache sits in front of the fused kernels. The kernels see a table of ``C`` rows (the
slots, inside the group's flat weight and state buffers) and ids that are slots; this class
makes a batch's rows resident before its lookup and translates its ids:

    prefetch(rows)       rows the batch needs -> CacheIndex.admit (hits, misses, victims)
                         -> dirty victims written back (weights and optimizer state together)
                         -> missing rows read from the store into the freed slots
                         (on the CPU both moves in one pass, ``neo._C.cache_swap_rows``; the
                         torch indexing here is the reference, and the GPU's path)
    slots_of(ids)        ids -> slots (invalid ids -> -1, which every kernel skips)
    flush()              every dirty slot written back (before a checkpoint, at the end)

A slot is dirty from the moment a training batch needs it (its fused backward will update it)
until it is written back. Eviction never touches a slot pinned by a batch in flight, so moves
run safely while a step computes on other slots of the same buffers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Dict, List, Sequence, Tuple

import torch

from neo.config.embedding import TableConfig
from neo.cpp import cpu_kernels
from neo.embedding.cache.index import Admission, CacheIndex
from neo.embedding.cache.moves import TorchMoves
from neo.embedding.cache.store import BackingStore

__all__ = ["CacheStats", "TableCache"]


@dataclass
class CacheStats:
    """Counters of one cached table (sums since creation; subtract two snapshots for a window)."""

    batches: int = 0
    accesses: int = 0
    """Distinct rows asked for, summed over batches."""
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    writebacks: int = 0
    """Dirty rows written to the store (on eviction and flush)."""
    bytes_in: int = 0
    """Bytes read from the store (weights and optimizer state)."""
    bytes_out: int = 0
    """Bytes written to the store."""
    prefetch_s: float = 0.0
    """Seconds spent making rows resident (index work and moves)."""
    exposed_s: float = 0.0
    """Seconds a lookup waited for its prefetch (the part not hidden under compute)."""

    def as_dict(self) -> Dict[str, float]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["hit_rate"] = self.hits / self.accesses if self.accesses else None
        d["hidden_s"] = max(0.0, self.prefetch_s - self.exposed_s)
        return d

    def add(self, other: "CacheStats") -> "CacheStats":
        return CacheStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


class TableCache:
    """The cache of one table (see the module docstring).

    Args:
        cfg: the table (``placement: cached``).
        weights: (C, D) view of the group's weight buffer holding the slots.
        states: the slots' optimizer state views, (C, D) or (C,).
        store: every row's weights and state.
        moves: how rows are translated and copied (:mod:`neo.embedding.cache.moves`).
        kernel: ``auto`` (the index's admissions and, with torch moves on the CPU, the row copies
            in ``neo._C`` where it is built) or ``reference`` (torch operations throughout). The
            same slots, rows and dirty flags either way (tested).
    """

    def __init__(self, cfg: TableConfig, weights: torch.Tensor, states: Sequence[torch.Tensor], store: BackingStore,
                 moves=None, kernel: str = "auto"):
        self.cfg, self.weights, self.states, self.store = cfg, weights, list(states), store
        self.moves = moves or TorchMoves()
        C = weights.shape[0]
        self.index = CacheIndex(cfg.name, cfg.num_rows, C, cfg.cache_policy, weights.device, kernel=kernel)
        self.cpp = (kernel == "auto" and self.moves.name == "torch" and weights.device.type == "cpu"
                    and store.weights.device.type == "cpu" and cpu_kernels("cache_swap_rows") is not None)
        """Whether an admission's row copies run in ``neo._C.cache_swap_rows``."""
        self.dirty = torch.zeros(C, dtype=torch.bool, device=weights.device)
        self.stats = CacheStats()

    @property
    def capacity(self) -> int:
        return self.index.capacity

    def prefetch(self, rows: torch.Tensor, future: Sequence[torch.Tensor] = (),
                 train: bool = True) -> Tuple[int, torch.Tensor]:
        """Make ``rows`` (sorted unique ids of the table) resident; returns the batch's ``seq`` and
        the slot of each of ``rows``."""
        t0 = time.perf_counter()
        adm = self.index.admit(rows, future)
        if self.cpp:
            self._swap(adm, train)
        else:
            self._write_back(adm.evicted_rows, adm.evicted_slots)
            self._fill(adm)
            if train:
                self.dirty[adm.slots] = True
        s = self.stats
        s.batches += 1
        s.accesses += int(adm.rows.numel())
        s.hits += adm.hits
        s.misses += int(adm.miss_rows.numel())
        s.evictions += int(adm.evicted_rows.numel())
        s.prefetch_s += time.perf_counter() - t0
        return adm.seq, adm.slots

    def _swap(self, adm: Admission, train: bool) -> None:
        """:meth:`_write_back` of the victims, :meth:`_fill` and the dirty marks, in one C++ pass."""
        st = self.store
        written = cpu_kernels("cache_swap_rows").cache_swap_rows(
            [self.weights] + self.states, [st.weights] + st.states, self.dirty, adm.evicted_slots, adm.evicted_rows,
            adm.fill_slots, adm.miss_rows, adm.slots if train else None)
        st.touched(written + int(adm.miss_rows.numel()))
        self.stats.writebacks += written
        self.stats.bytes_out += written * st.row_bytes
        self.stats.bytes_in += int(adm.miss_rows.numel()) * st.row_bytes

    def _write_back(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        d = self.dirty[slots]
        if not bool(d.any()):
            return
        slots, rows = slots[d], rows[d]
        mv = self.moves
        self.store.write(rows, mv.gather(self.weights, slots), [mv.gather(s, slots) for s in self.states])
        self.dirty[slots] = False
        self.stats.writebacks += int(rows.numel())
        self.stats.bytes_out += int(rows.numel()) * self.store.row_bytes

    def _fill(self, adm: Admission) -> None:
        if adm.fill_slots.numel() == 0:
            return
        w, st = self.store.read(adm.miss_rows)
        self.moves.scatter(self.weights, adm.fill_slots, w)
        for view, v in zip(self.states, st):
            self.moves.scatter(view, adm.fill_slots, v)
        self.dirty[adm.fill_slots] = False
        self.stats.bytes_in += int(adm.miss_rows.numel()) * self.store.row_bytes

    def slots_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Slots of ``ids`` (resident after :meth:`prefetch`); ids outside [0, N) give -1."""
        return self.moves.slots_of(self.index.slot_of_row, ids, self.cfg.num_rows)

    def complete(self, seq: int) -> None:
        self.index.complete(seq)

    def flush(self) -> int:
        """Write every dirty slot back to the store; returns the rows written."""
        rows, slots = self.index.resident_rows()
        before = self.stats.writebacks
        self._write_back(rows, slots)
        return self.stats.writebacks - before

    def drop(self) -> None:
        """Flush, then forget every cached row (after the store was written from outside)."""
        self.flush()
        self.index.clear()

    def resident(self) -> List[int]:
        return self.index.resident_rows()[0].tolist()
