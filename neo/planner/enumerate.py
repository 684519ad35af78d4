"""Stage 1 + 2: enumerate the sharding options of each table and estimate their costs.

An :class:`Option` is one way to split a table (a sharding type and, for column shards,
a width) together with the cost of each of its shards ("parts"). Its ``scope`` says how
the partitioner places the parts:

- ``rank``: each part goes to any allowed rank (table_wise, column_wise);
- ``node``: all parts go to the ranks of ONE node (table_row_wise: part j on local rank j;
  table_column_wise: parts on the node's least-loaded ranks);
- ``fixed``: part k on rank k (row_wise, data_parallel).

A cached table (``placement: cached``) has one option per sharding and cache size (its fixed
``cache_fraction``, else each of :data:`neo.planner.cache_model.CACHE_FRACTIONS` whose cache
holds two batches' distinct rows); an ``auto`` table has its device options and, when
``allow_cache``, its cached ones.

After TorchRec's ``EmbeddingEnumerator`` (torchrec/distributed/planner/enumerators.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from neo.planner.cache_model import CACHE_FRACTIONS
from neo.planner.cost import PartCosts, estimate_many, estimate_parts
from neo.planner.constants import CostConstants
from neo.planner.types import GIB, Placement, PlanningError, ShardingType, TableSpec, Topology

__all__ = ["Option", "enumerate_options", "expected_rank_footprint", "split_evenly", "column_widths"]

_MODEL_PARALLEL_PINNABLE = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)
_ALL_TYPES = tuple(ShardingType)


@dataclass(frozen=True)
class _Parts:
    """How one table is split: its sharding type and its parts' offsets and sizes."""

    table: int
    """Index of the table in the planner's input list."""
    sharding_type: ShardingType
    scope: str
    """``rank``, ``node`` or ``fixed`` (see module docstring)."""
    row_offset: np.ndarray
    rows: np.ndarray
    col_offset: np.ndarray
    cols: np.ndarray


@dataclass(frozen=True)
class Option(_Parts):
    """One sharding option of one table, with the estimated cost of each part."""

    costs: PartCosts
    allowed_ranks: Optional[Tuple[int, ...]] = None
    """Pinned ranks (scope ``rank`` only); None = any rank."""
    cache_fraction: Optional[float] = None
    """Cached: the share of each part's rows its cache holds; None: every row on the device."""

    @property
    def num_parts(self) -> int:
        return len(self.rows)

    def part_seconds(self, speed: float = 1.0) -> np.ndarray:
        return self.costs.compute / speed + self.costs.comm

    # computed once: the proposals read them for every option, many times over
    @functools.cached_property
    def total_seconds(self) -> float:
        """Sum of the parts' times (the work this option adds to the whole cluster)."""
        return float(self.part_seconds().sum())

    @functools.cached_property
    def max_part_seconds(self) -> float:
        return float(self.part_seconds().max())

    @functools.cached_property
    def max_part_hbm(self) -> float:
        return float(self.costs.hbm.max())


def split_evenly(n: int, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Offsets and sizes of ``k`` contiguous ranges covering ``n``; sizes differ by at most 1."""
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return offsets, sizes


def column_widths(dim: int, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """Offsets and widths of column shards of ``width`` (the last one may be narrower)."""
    n = -(-dim // width)
    widths = np.full(n, width, dtype=np.int64)
    widths[-1] = dim - width * (n - 1)
    return np.arange(n, dtype=np.int64) * width, widths


def _round4(x: float) -> int:
    return max(4, int(-(-x // 4)) * 4)


def _default_cw_widths(dim: int, max_shards: int) -> List[int]:
    """Widths giving 2, 4, 8, ... shards (at most ``max_shards``), each a multiple of 4."""
    out, k = [], 2
    while k <= max_shards and dim // k >= 4:
        w = _round4(dim / k)
        if w < dim and w not in out:
            out.append(w)
        k *= 2
    return out


def _check_constraints(idx: int, t: TableSpec, topo: Topology) -> Tuple[ShardingType, ...]:
    cons = t.constraints
    allowed = tuple(cons.sharding_types) or _ALL_TYPES
    W = topo.world_size
    bad = [r for r in cons.ranks if not 0 <= r < W]
    if bad:
        raise PlanningError(f"table '{t.name}': pinned ranks {bad} out of range [0, {W})")
    if cons.column_shard_width is not None:
        w = cons.column_shard_width
        if w <= 0 or w % 4 or w > t.dim:
            raise PlanningError(f"table '{t.name}': column_shard_width {w} must be a positive multiple "
                                f"of 4 and at most dim {t.dim}")
    if cons.ranks:
        pinnable = tuple(s for s in allowed if s in _MODEL_PARALLEL_PINNABLE)
        if not pinnable:
            raise PlanningError(
                f"table '{t.name}': pinned ranks {list(cons.ranks)} are only honoured by "
                f"{[s.value for s in _MODEL_PARALLEL_PINNABLE]}, but sharding_types is "
                f"{[s.value for s in allowed]}")
        allowed = pinnable
    if t.rows <= 0 or t.dim <= 0 or t.dim % 4:
        raise PlanningError(f"table '{t.name}': rows must be > 0 and dim a positive multiple of 4, "
                            f"got rows={t.rows} dim={t.dim}")
    return allowed


def _fractions(t: TableSpec, allow_cache: bool) -> List[Optional[float]]:
    """Cache shares to consider (None: on the device)."""
    p = t.constraints.placement
    if p is Placement.DEVICE or (p is Placement.AUTO and not allow_cache):
        return [None]
    cached = [t.cache_fraction] if t.cache_fraction is not None else list(CACHE_FRACTIONS)
    return cached if p is Placement.CACHED else [None] + cached


@dataclass(frozen=True)
class _Split(_Parts):
    """One way to split one table, before its costs, and the cache shares to cost it at (None: on
    the device)."""

    pins: Optional[Tuple[int, ...]]
    fractions: Tuple[Optional[float], ...]


def table_splits(idx: int, t: TableSpec, topo: Topology, allow_cache: bool = True) -> List[_Split]:
    """Every split of table ``idx`` allowed by its constraints, in the order its options are listed."""
    allowed = _check_constraints(idx, t, topo)
    fr = tuple(_fractions(t, allow_cache))
    W, L = topo.world_size, topo.local_world_size
    pins = tuple(sorted(set(t.constraints.ranks))) or None
    width = t.constraints.column_shard_width
    out: List[_Split] = []

    def add(st, scope, ro, rs, co, cs, p=None):
        out.append(_Split(idx, st, scope, np.asarray(ro), np.asarray(rs), np.asarray(co), np.asarray(cs), p, fr))

    for st in allowed:
        if st is ShardingType.TABLE_WISE:
            add(st, "rank", np.array([0]), np.array([t.rows]), np.array([0]), np.array([t.dim]), pins)
        elif st is ShardingType.DATA_PARALLEL:
            add(st, "fixed", np.zeros(W, np.int64), np.full(W, t.rows), np.zeros(W, np.int64), np.full(W, t.dim))
        elif st in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
            k = W if st is ShardingType.ROW_WISE else L
            ro, rs = split_evenly(t.rows, k)
            add(st, "fixed" if k == W and st is ShardingType.ROW_WISE else "node", ro, rs, np.zeros(k, np.int64),
                np.full(k, t.dim))
        elif st is ShardingType.COLUMN_WISE:
            widths = [width] if width else _default_cw_widths(t.dim, len(pins) if pins else W)
            if not widths and st in t.constraints.sharding_types:
                widths = [t.dim]  # forced but too narrow to split: a single column shard
            for w in widths:
                co, cs = column_widths(t.dim, w)
                add(st, "rank", np.zeros(len(cs), np.int64), np.full(len(cs), t.rows), co, cs, pins)
        elif st is ShardingType.TABLE_COLUMN_WISE:
            w = width or _round4(t.dim / min(L, max(1, t.dim // 4)))
            co, cs = column_widths(t.dim, w)
            add(st, "node", np.zeros(len(cs), np.int64), np.full(len(cs), t.rows), co, cs)
    return out


def _options_of(sp: _Split, t: TableSpec, costs: dict, k: int, topo: Topology, c: CostConstants,
                rank_footprint: Optional[float]) -> List[Option]:
    """The options of split ``k`` (``sp``), one per cache share; a cache too small for two steps'
    distinct rows (the step computing and the one prefetching) is left out, and when every one
    of a cached table's shares is, the smallest share that holds them stands in."""
    out, need = [], 0.0
    rs = sp.rows
    for f in sp.fractions:
        pc = costs[(k, f)]
        if f is not None:
            short = (np.ceil(f * rs) < 2.0 * pc.distinct) & (rs > 0)
            if short.any():
                need = max(need, float((2.0 * pc.distinct[short] / rs[short]).max()))
                continue
        out.append(Option(sp.table, sp.sharding_type, sp.scope, sp.row_offset, rs, sp.col_offset, sp.cols, pc,
                          sp.pins, f))
    if not out and need:
        f = min(1.0, math.ceil(need * 100.0) / 100.0)
        out.append(Option(sp.table, sp.sharding_type, sp.scope, sp.row_offset, rs, sp.col_offset, sp.cols,
                          estimate_parts(t, sp.sharding_type, rs, sp.cols, topo, c, f, rank_footprint), sp.pins, f))
    return out


def table_options(tables: Sequence[TableSpec], topo: Topology, c: CostConstants, allow_cache: bool = True,
                  rank_footprint: Optional[float] = None) -> List[List[Option]]:
    """All options of each table allowed by its constraints (before the memory filter), the
    tables' parts costed together; ``rank_footprint``: bytes of tables a rank is expected to hold
    (:func:`expected_rank_footprint`)."""
    splits = [sp for idx, t in enumerate(tables) for sp in table_splits(idx, t, topo, allow_cache)]
    keys = [(k, f) for k, sp in enumerate(splits) for f in sp.fractions]
    costs = dict(zip(keys, estimate_many(tables, [(splits[k].table, splits[k].sharding_type, splits[k].rows,
                                                   splits[k].cols, f, rank_footprint) for k, f in keys], topo, c)))
    out: List[List[Option]] = [[] for _ in tables]
    for k, sp in enumerate(splits):
        out[sp.table].extend(_options_of(sp, tables[sp.table], costs, k, topo, c, rank_footprint))
    return out


def _capacity(topo: Topology, c: CostConstants) -> np.ndarray:
    return np.array([d.hbm_bytes for d in topo.devices], dtype=np.float64) * (1.0 - c.memory_headroom)


def _shortfall(opt: Option, topo: Topology, hbm_cap: np.ndarray, host_cap: np.ndarray) -> float:
    """Bytes by which the option's largest part exceeds the best device it may use (<= 0: fits)."""
    if opt.scope == "fixed":
        return float(max((opt.costs.hbm - hbm_cap).max(), (opt.costs.host - host_cap).max()))
    ranks = list(opt.allowed_ranks) if opt.allowed_ranks else slice(None)
    return float(max(opt.costs.hbm.max() - hbm_cap[ranks].max(), opt.costs.host.max() - host_cap[ranks].max()))


def expected_rank_footprint(tables: Sequence[TableSpec], world_size: int) -> float:
    """Bytes (rows and optimizer state) of all tables over the ranks: what a rank is expected to
    hold before placement decides (the step model then uses each rank's own)."""
    return sum(float(t.rows) * t.bytes_per_row(t.dim) for t in tables) / max(1, world_size)


def enumerate_options(tables: Sequence[TableSpec], topo: Topology, c: CostConstants,
                      allow_cache: bool = True) -> List[List[Option]]:
    """Options of every table whose parts fit a device; raises :class:`PlanningError` naming
    the table and the memory missing when none does. ``allow_cache=False``: ``auto`` tables on
    the device only (the planner's first try)."""
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise PlanningError(f"duplicate table names: {dup}")
    hbm_cap = _capacity(topo, c)
    host_cap = np.array([d.host_bytes for d in topo.devices], dtype=np.float64)
    out: List[List[Option]] = []
    share = expected_rank_footprint(tables, topo.world_size)
    every = table_options(tables, topo, c, allow_cache, share)
    for idx, t in enumerate(tables):
        opts = every[idx]
        fits = [o for o in opts if _shortfall(o, topo, hbm_cap, host_cap) <= 0]
        if not fits:
            counted = [o for o in opts if math.isfinite(_shortfall(o, topo, hbm_cap, host_cap))]
            if not counted:                        # every option's bytes overflow (inf, nan): no size to give
                raise PlanningError(
                    f"table '{t.name}' cannot be placed: the bytes of its shards overflow (too many for a float) with "
                    f"pooling_factor {t.pooling_factor:g} x num_features {t.num_features} ids per sample, "
                    f"batch_size_per_rank {topo.batch_size_per_rank}, world_size {topo.world_size}, "
                    f"{t.rows} rows of dim {t.dim}; check the table's statistics")
            best = min(counted, key=lambda o: _shortfall(o, topo, hbm_cap, host_cap))
            miss = _shortfall(best, topo, hbm_cap, host_cap)
            # the memory that is short: device (hbm_gib) or host (host_gib: a cached table's rows)
            host_short = _shortfall(best, topo, np.full_like(hbm_cap, np.inf), host_cap) >= miss
            need = float(best.costs.host.max()) if host_short else best.max_part_hbm
            memory = "host memory (topology.host_gib)" if host_short else "device memory (topology.hbm_gib)"
            raise PlanningError(
                f"table '{t.name}' cannot be placed: its smallest shard ({best.sharding_type.value}, "
                f"{'cached' if best.cache_fraction is not None else 'device'} placement) needs {need:.0f} bytes "
                f"({need / GIB:.2f} GiB) of {memory} on one rank; {miss:.0f} bytes ({miss / GIB:.2f} GiB) missing. "
                f"Allowed sharding types: {[o.value for o in (t.constraints.sharding_types or tuple(ShardingType))]}")
        out.append(fits)
    return out
