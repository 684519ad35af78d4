"""Hit rates of cache policies on an id trace: ``neo cache-report`` and the planner's miss-ratio curves.

A trace is the row ids of one table in access order, cut into batches of B ids. Accesses are
the distinct ids of each batch (a batch's rows are brought in once, whatever their count).

- ``lru``, ``lfu``, ``lookahead``: :class:`~neo.embedding.cache.index.CacheIndex` itself, the
  code that decides evictions in training, each batch admitted and then completed (with
  ``pipelined``, batch b+1 is admitted before b completes, as under the training pipeline,
  which pins two batches). ``lookahead`` sees the next ``lookahead`` batches.
- ``belady``: the exact optimum (Belady's MIN) over the sequence of every batch's sorted
  distinct ids, every accessed row brought into the cache: evict the resident row whose next
  access is farthest (never first). The bar every policy is measured against.
- ``ways``: a set-associative cache of the same capacity (FBGEMM's GPU cache has 32 ways),
  lru or lfu within each set (rows hashed to sets); its ``conflict_misses`` are the accesses
  it misses that the fully associative cache of the same capacity and policy hits. Sets are
  sized as FBGEMM sizes them, ``ceil(capacity / ways)``; FBGEMM then holds ``sets x ways`` rows,
  up to ``ways - 1`` more than asked for, so here the capacity is spread over the sets (each
  holds ``capacity // sets`` or one more rows, at most ``ways``) and the simulated cache holds
  exactly ``capacity`` rows, as the fully associative cache and Belady it is compared with do.
  ``ways`` may not exceed the capacity.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import torch

from neo.config.embedding import CachePolicy
from neo.embedding.cache.index import Admission, CacheCapacityError, CacheIndex

__all__ = ["SimResult", "SteadyHitRate", "TraceCache", "rows_needed", "batch_rows", "simulate", "simulate_belady",
           "simulate_set_associative", "report", "POLICIES"]

POLICIES = ("lru", "lfu", "lookahead", "belady")


@dataclass
class SimResult:
    """One (capacity, policy) row of ``neo cache-report``."""

    capacity: int
    policy: str
    accesses: int
    hits: int
    hit_rate: float
    ways: Optional[int] = None
    conflict_misses: Optional[int] = None
    warmup_batches: Optional[int] = None
    """Batches before the counted ones that only warmed the cache (``neo cache-report
    --warmup-batches``); None: every batch counted, from an empty cache."""

    def to_dict(self) -> Dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("capacity", "policy")}


def batch_rows(trace: np.ndarray, batch_size: int, num_rows: int) -> List[np.ndarray]:
    """Sorted distinct ids of each batch of ``batch_size`` ids (the last, partial batch included)."""
    trace = np.asarray(trace)
    if trace.ndim != 1 or not np.issubdtype(trace.dtype, np.integer):
        raise ValueError(f"the trace must be a 1-D integer array, got shape {trace.shape} and dtype {trace.dtype}")
    if batch_size <= 0:
        raise ValueError(f"batch size must be > 0, got {batch_size}")
    bad = (trace < 0) | (trace >= num_rows)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise ValueError(f"trace position {pos}: id {int(trace[pos])} is outside [0, {num_rows}) "
                         f"({int(bad.sum())} ids out of range)")
    return [np.unique(trace[i:i + batch_size]) for i in range(0, len(trace), batch_size)]


def rows_needed(batches: Sequence[np.ndarray], pipelined: bool) -> int:
    """The fewest slots a cache needs for these batches (sorted distinct rows): the largest batch,
    or with ``pipelined`` (two batches in flight) the largest union of two consecutive ones."""
    if not pipelined or len(batches) == 1:
        return max(len(b) for b in batches)
    return max(len(np.union1d(a, b)) for a, b in zip(batches, batches[1:]))


def _check_capacity(batches: Sequence[np.ndarray], capacity: int, num_rows: int, pinned_batches: int) -> None:
    if not 0 < capacity <= num_rows:
        raise ValueError(f"capacity {capacity} must be in [1, {num_rows}]")
    need = rows_needed(batches, pinned_batches > 1)
    if need > capacity:
        raise CacheCapacityError(f"capacity {capacity} is below the {need} distinct rows of "
                                 f"{'one batch' if pinned_batches == 1 else 'two consecutive batches'}")


class TraceCache:
    """A cache index fed a table's batches one at a time (sorted distinct rows), admitted as
    training admits them: the lookahead policy sees the next ``lookahead`` batches, so a batch is
    admitted once they have been fed; with ``pipelined`` a batch completes only once the next is
    admitted (two batches in flight), else at once. CacheCapacityError where a batch (and the one
    in flight) needs more rows than the cache holds."""

    def __init__(self, num_rows: int, capacity: int, policy: str, lookahead: int = 2, pipelined: bool = True):
        self.index = CacheIndex("trace", num_rows, capacity, CachePolicy(policy))
        self._k = lookahead if policy == "lookahead" else 0
        self._pipelined = pipelined
        self._pending: List[torch.Tensor] = []        # fed, not yet admitted (the lookahead's window)
        self._prev: Optional[int] = None

    @property
    def pending(self) -> int:
        """Batches fed but not admitted yet (the lookahead window's)."""
        return len(self._pending)

    def feed(self, rows) -> Optional[Admission]:
        """Batch ``rows``; the admission of the batch this completes the window of, if any."""
        self._pending.append(torch.as_tensor(np.asarray(rows, dtype=np.int64)))
        return self.admit_next() if len(self._pending) > self._k else None

    def admit_all(self, batches: Iterable) -> Iterator[Admission]:
        """Feed every batch, then admit the ones the window held back: each admission in order."""
        for rows in batches:
            adm = self.feed(rows)
            if adm is not None:
                yield adm
        while self._pending:
            yield self.admit_next()

    def admit_next(self) -> Admission:
        """Admit the oldest batch fed (at the end of the trace: with what is left of its window)."""
        rows = self._pending.pop(0)
        adm = self.index.admit(rows, self._pending[:self._k])
        if not self._pipelined:
            self.index.complete(adm.seq)
            return adm
        if self._prev is not None:
            self.index.complete(self._prev)
        self._prev = adm.seq
        return adm


def simulate(batches: Sequence[np.ndarray], num_rows: int, capacity: int, policy: str, lookahead: int = 2,
             pipelined: bool = False, hit_masks: Optional[List[np.ndarray]] = None, warmup: int = 0) -> SimResult:
    """lru / lfu / lookahead with the training cache's own index (see the module docstring).
    ``hit_masks``: a list that receives each batch's (U,) bool mask of hits. ``warmup``: the first
    batches only warm the cache (their accesses and hits are not counted)."""
    _check_capacity(batches, capacity, num_rows, 2 if pipelined else 1)
    cache = TraceCache(num_rows, capacity, policy, lookahead, pipelined)
    hits = accesses = 0
    for i, adm in enumerate(cache.admit_all(batches)):
        if i >= warmup:
            hits += adm.hits
            accesses += int(adm.rows.numel())
        if hit_masks is not None:
            hit_masks.append(~np.isin(batches[i], adm.miss_rows.numpy()))
    return SimResult(capacity, policy, accesses, hits, hits / accesses if accesses else 0.0,
                     warmup_batches=warmup or None)


class SteadyHitRate:
    """The hit rate of one cache once it is warm: a :class:`TraceCache` (two batches pinned, as
    under the pipeline) fed a table's batches one at a time.

    The cache starts empty. It is *warm* once its misses reach ``turnovers`` times its capacity
    (filled, then its rows replaced once more: on Zipf(1.05) ids over 2M rows the hit rate of a
    5% cache is 0.46 over its first 50 batches and 0.65-0.68 from batch 100 on, while 16 batches
    from cold find 0.33 at any size, docs/cache.md); the hits of the ``counted`` batches admitted
    after that are the result. ``done``: those batches are counted; ``hit_rate``: None before any
    warm batch was counted."""

    def __init__(self, num_rows: int, capacity: int, policy: str, lookahead: int, counted: int,
                 turnovers: float = 2.0):
        if counted <= 0:
            raise ValueError(f"counted must be > 0, got {counted}")
        self.cache = TraceCache(num_rows, capacity, policy, lookahead, pipelined=True)
        self.counted, self.warm_misses = counted, turnovers * capacity
        self.misses = self.hits = self.accesses = self.batches = self.admitted = 0

    @property
    def warm(self) -> bool:
        return self.misses >= self.warm_misses

    @property
    def done(self) -> bool:
        return self.batches >= self.counted

    @property
    def hit_rate(self) -> Optional[float]:
        return self.hits / self.accesses if self.accesses else None

    @property
    def pending(self) -> int:
        """Batches fed but not admitted yet (the lookahead window's)."""
        return self.cache.pending

    def batches_to_warm(self) -> float:
        """Batches still needed to warm up at the rate of misses so far (0 once warm; infinite
        before any miss). A cache's rate of misses only falls as it fills: a lower bound."""
        if self.warm:
            return 0.0
        if self.misses == 0:
            return math.inf
        return math.ceil((self.warm_misses - self.misses) * self.admitted / self.misses)

    def feed(self, rows: np.ndarray) -> None:
        """Batch ``rows`` (sorted distinct ids); CacheCapacityError if it and the batch before need
        more rows than the cache holds."""
        adm = self.cache.feed(rows)
        if adm is not None:
            self._count(adm)

    def finish(self) -> None:
        """No batch will follow: admit the ones the lookahead window held back."""
        while self.cache.pending and not self.done:
            self._count(self.cache.admit_next())

    def _count(self, adm: Admission) -> None:
        warm = self.warm                        # as the cache was when it admitted this batch
        self.admitted += 1
        self.misses += int(adm.rows.numel()) - adm.hits
        if warm and not self.done:
            self.hits += adm.hits
            self.accesses += int(adm.rows.numel())
            self.batches += 1


def simulate_belady(batches: Sequence[np.ndarray], capacity: int, warmup: int = 0) -> SimResult:
    """Belady's MIN on the concatenated sorted distinct ids of the batches (exact optimum);
    ``warmup``: the first batches' accesses are not counted (the cache they leave is MIN's)."""
    seq = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    n = len(seq)
    start = sum(len(b) for b in batches[:warmup])             # the first counted access
    order = np.lexsort((np.arange(n), seq))                   # by row, then position
    nxt = np.full(n, n, dtype=np.int64)                       # n: never again
    same = seq[order[1:]] == seq[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    resident: Dict[int, int] = {}                             # row -> its next access
    heap: List = []                                           # (-next access, row), stale entries skipped
    hits = 0
    for i in range(n):
        row, nu = int(seq[i]), int(nxt[i])
        if row in resident:
            hits += i >= start
        elif len(resident) >= capacity:
            while True:
                neg, victim = heapq.heappop(heap)
                if resident.get(victim) == -neg:
                    del resident[victim]
                    break
        resident[row] = nu
        heapq.heappush(heap, (-nu, row))
    counted = n - start
    return SimResult(capacity, "belady", counted, hits, hits / counted if counted else 0.0,
                     warmup_batches=warmup or None)


def simulate_set_associative(batches: Sequence[np.ndarray], num_rows: int, capacity: int, policy: str,
                             ways: int, warmup: int = 0) -> SimResult:
    """A ``ways``-way set-associative cache of exactly ``capacity`` rows, ``policy`` (lru, lfu)
    within each set.

    ``sets = ceil(capacity / ways)``, as FBGEMM sizes its cache (``cache_sets = (rows + ways - 1)
    // ways``); where FBGEMM would then hold ``sets x ways`` rows, the capacity is spread over the
    sets here (each holds ``capacity // sets`` or one more rows, never more than ``ways``), so the
    comparison with the fully associative cache and Belady is at the same capacity. Rows go to set
    ``hash(row) % sets``. A batch's missing rows take, in each set, the ways its own rows do not
    use, least recently (lru) or least frequently (lfu, ties by recency) used first; rows beyond
    those miss without being cached, as in a hardware-style set-associative cache (FBGEMM's
    ``lxu_cache``). Raises ValueError when ``ways`` exceeds ``capacity``. ``warmup``: the first
    batches only warm the cache (not counted)."""
    if policy not in ("lru", "lfu"):
        raise ValueError(f"set-associative simulation supports lru and lfu, not {policy!r}")
    if isinstance(ways, bool) or not isinstance(ways, (int, np.integer)) or ways <= 0:
        raise ValueError(f"ways must be a positive integer, got {ways!r}")
    if ways > capacity:
        raise ValueError(f"ways {ways} exceeds the capacity {capacity} rows (a set cannot hold more "
                         f"ways than the cache has rows)")
    sets = -(-capacity // ways)                                              # FBGEMM: ceil(capacity / ways)
    per_set = capacity // sets + (np.arange(sets) < capacity % sets)       # sums to capacity, each <= ways
    disabled = np.arange(ways)[None, :] >= per_set[:, None]                 # (sets, ways): ways a set lacks
    tag = np.full((sets, ways), -1, dtype=np.int64)
    last = np.zeros((sets, ways), dtype=np.int64)
    count = np.zeros(num_rows, dtype=np.int64) if policy == "lfu" else None
    full_hits: List[np.ndarray] = []
    simulate(batches, num_rows, capacity, policy, hit_masks=full_hits)
    hits = accesses = conflict = 0
    for b, rows in enumerate(batches, start=1):
        rows = rows.astype(np.int64)
        if count is not None:
            count[rows] += 1
        s_of = (rows * 0x9E3779B1) % sets                                   # multiplicative hash
        match = tag[s_of] == rows[:, None]                                  # (U, ways)
        present = match.any(axis=1)
        if b > warmup:
            hits += int(present.sum())
            accesses += len(rows)
            conflict += int((~present & full_hits[b - 1]).sum())
        r_idx, w_idx = np.nonzero(match)
        last[s_of[r_idx], w_idx] = b                                         # used by this batch: kept
        miss, ms = rows[~present], s_of[~present]
        if not len(miss):
            continue
        order = np.argsort(ms, kind="stable")
        miss, ms = miss[order], ms[order]
        first = np.searchsorted(ms, ms, side="left")
        rank = np.arange(len(ms)) - first                                    # j-th miss of its set
        u_sets = np.unique(ms)
        key = last[u_sets].astype(np.float64)                                # (S, ways)
        if count is not None:
            key = np.where(tag[u_sets] >= 0, count[np.maximum(tag[u_sets], 0)] * 2.0 ** 32, 0.0) + key
        key[tag[u_sets] < 0] = -1.0                                          # free ways first
        key[last[u_sets] == b] = np.inf                                      # this batch's rows stay
        key[disabled[u_sets]] = np.inf                                       # beyond the set's share
        way_order = np.argsort(key, axis=1, kind="stable")
        set_pos = np.searchsorted(u_sets, ms)
        ok = rank < ways
        w = way_order[set_pos[ok], rank[ok]]
        usable = np.isfinite(key[set_pos[ok], w])
        tag[ms[ok][usable], w[usable]] = miss[ok][usable]
        last[ms[ok][usable], w[usable]] = b
    return SimResult(capacity, policy, accesses, hits, hits / accesses if accesses else 0.0, ways, int(conflict),
                     warmup or None)


def report(batches: Sequence[np.ndarray], num_rows: int, capacities: Iterable[int],
           policies: Sequence[str] = POLICIES, lookahead: int = 2, ways: Optional[int] = None,
           pipelined: bool = False, warmup: int = 0) -> List[SimResult]:
    """Every (capacity, policy) result, capacities in the order given (``neo cache-report``);
    ``warmup``: the first batches warm every cache and are not counted."""
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"unknown policies {bad}; valid: {list(POLICIES)}")
    out = []
    for k in capacities:
        for p in policies:
            if p == "belady":
                out.append(simulate_belady(batches, k, warmup))
            elif ways:
                out.append(simulate_set_associative(batches, num_rows, k, p, ways, warmup) if p != "lookahead"
                           else simulate(batches, num_rows, k, p, lookahead, pipelined, warmup=warmup))
            else:
                out.append(simulate(batches, num_rows, k, p, lookahead, pipelined, warmup=warmup))
    return out
