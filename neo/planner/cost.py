"""Cost model: per-shard lookup and update time, communication time and bytes, memory.

Formulas (docs/planner.md has the derivation; the constants are :class:`CostConstants`,
measured by ``neo calibrate``). Notation: B = batch per rank, W ranks, L ranks per node,
N = W / L nodes, G = B * W global batch, F features of the table, P pooling factor, D dim,
s weight bytes, c shard columns, rho = shard rows / table rows, a = activation bytes,
i = id bytes; a shard's row bytes r = c*s, state bytes q, footprint rows * (r + q).

- Forward (fused lookup) of a shard: ``bags * lookup_bag_s + ids * (lookup_id_s + r /
  bw_lookup(footprint))`` + ``kernel_overhead``, where bw goes log-linearly from
  ``lookup_bw_hot`` (footprint <= ``hot_bytes``: rows come from the caches) to
  ``lookup_bw_cold`` (footprint >= ``cold_bytes``). The footprint is the rank's: the bytes of
  all the tables its fused kernels walk (the step model knows them from the plan; the search,
  before placing, assumes an even share of all tables' bytes). The owner of a model-parallel shard serves
  the global batch (ids = G*F*P*rho: ids assumed spread over row blocks, e.g. hashed); a
  data-parallel replica pools its own batch (B*F*P).
- Backward + fused optimizer: ``ids * update_id_s + U * (update_row_s + 2 (r + q) /
  bw_update(footprint))`` over the ids whose gradients the shard applies (a data-parallel
  replica: the global batch's), U = distinct rows among them (Zipf(access_skew) model, or the
  measured count, :mod:`neo.planner.cache_model`). Per-id weights that require grad (position
  weights) add ``w (F * weighted_feature_s + bags * weighted_bag_s + ids * weighted_id_s)``, w
  the share of the table's features that have them (the weights' read and their gradient's
  pass; measured).
- Cached placement: plus the cache's work of a step (the batch's admission and its row moves,
  ``TableCache.prefetch``): ``cache_batch_s + U x cache_access_s + U (1 - h(f)) x (2 (r + q) /
  host_bw + cache_miss_latency)`` (every distinct row is looked up in the index, counted and
  pinned; each miss has a victim chosen, its row read and the victim written back). It runs on
  the cache's worker thread, under the step before: the planner counts it in the part's time;
  the step model (:mod:`neo.planner.step_model`) keeps it off the critical path but on the
  node's cores. A cached part's lookups and update walk its slots: their footprint is the slots'.
- Input distribution: the owner receives the ids of its parts (i bytes each, i + 4 for a
  weighted feature's: its weight or slot; i + 4w on average), (L-1)/W of
  them from its node (``intra_bw``) and (W-L)/W from other nodes (``inter_bw``); every rank
  sends its own (the input side); data-parallel replicas receive every rank's ids.
- Output distribution: pooled AlltoAll (forward) and its gradient (backward): 2*G*F*c*a
  bytes, same split; row-wise ReduceScatter + AllGather of the G*F*c partial sums,
  hierarchical; data-parallel: the AllGather of the (B, c) gradients, (W-1)*B*F*c*a bytes.
- Memory: weights rows*c*s + optimizer state + I/O buffers (ids received, pooled outputs and
  their gradients). A cached shard holds f of its rows plus the cache index (16 bytes per row
  of the shard: slot, count and lookahead window; 17 per slot) in device memory and every row
  in the backing store (``host``).
- Latency: each collective kind the plan uses costs ``intra_latency`` (``inter_latency``
  across nodes) once per step, the same on every rank (collectives are fused across tables),
  and, on every rank, each bag of the global batch of a table of a kind other than table-wise
  its kind's measured code-path overhead (``row_wise_overhead``...: parts per rank to bucketize,
  reduce or reassemble; :func:`input_side_split`), charged to the output distribution.

References: Mudigere et al., ISCA 2022 (Neo), Sec. 4: cost = communication + load
imbalance; TorchRec ``shard_estimators.py`` (EmbeddingPerfEstimator) for the split into
forward/backward compute and input/output communication.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from neo.planner.cache_model import distinct_per_batch_of, hit_rate
from neo.planner.constants import KIND_OVERHEADS, CostConstants
from neo.planner.types import ShardingType, TableSpec, Topology

__all__ = ["PartCosts", "PartTables", "estimate_parts", "estimate_many", "estimate_joined", "input_side_cost",
           "input_side_split", "zipf_hit_rate", "collective_latency", "collective_latency_split", "cache_parts",
           "lookup_parts", "seconds_per_byte"]


@dataclass(frozen=True)
class PartCosts:
    """Costs of the shards (parts) of one sharding option; arrays of equal length.

    ``compute`` (= ``fwd`` + ``bwd``) is seconds at speed 1.0 (divide by the device speed);
    ``comm`` (= ``comm_in`` + output distribution) seconds.
    """

    compute: np.ndarray
    comm: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    bytes_intra: np.ndarray
    bytes_inter: np.ndarray
    hit_rate: Optional[np.ndarray] = None
    """Cached parts: expected hit rate of a step's distinct rows."""
    miss_seconds: Optional[np.ndarray] = None
    """Cached parts: seconds of the cache's work a step (the batch's admission and its misses'
    moves, on the cache's worker thread; included in ``compute``, not in ``bwd``)."""
    distinct: Optional[np.ndarray] = None
    """Distinct rows a step's update touches (a cache must hold two steps' worth)."""
    fwd: Optional[np.ndarray] = None
    """Forward lookup seconds (at speed 1), ``kernel_overhead`` included."""
    bwd: Optional[np.ndarray] = None
    """Backward + fused optimizer seconds (at speed 1); a cached part's cache work is ``miss_seconds``."""
    comm_in: Optional[np.ndarray] = None
    """Input distribution seconds (the ids), part of ``comm``."""


def zipf_hit_rate(cached_rows: float, rows: int, alpha: float) -> float:
    """Fraction of lookups hitting the ``cached_rows`` hottest of ``rows`` under Zipf(alpha).

    Uses the integral approximation of the generalized harmonic number H(n, alpha).
    """
    if rows <= 0:
        return 1.0
    k = max(0.0, min(float(rows), cached_rows))
    if k <= 0:
        return 0.0

    def harmonic(n: float) -> float:
        if abs(alpha - 1.0) < 1e-9:
            return math.log(n) + 1.0
        return (n ** (1.0 - alpha) - 1.0) / (1.0 - alpha) + 1.0

    return min(1.0, harmonic(k) / harmonic(float(rows)))


def _hier_collective(volume: np.ndarray, topo: Topology, c: CostConstants):
    """Bytes (intra, inter) and seconds of a hierarchical ReduceScatter of ``volume`` bytes per rank."""
    L, N = topo.local_world_size, topo.num_nodes
    intra = volume * (L - 1) / L
    inter = (volume / L) * (N - 1) / N
    return intra, inter, intra / c.intra_bw + inter / c.inter_bw


def seconds_per_byte(footprint: np.ndarray, hot_bw: float, cold_bw: float, c: CostConstants) -> np.ndarray:
    """1 / bandwidth for tables of ``footprint`` bytes: hot up to ``hot_bytes``, cold from ``cold_bytes``."""
    f = np.maximum(np.asarray(footprint, dtype=np.float64), 1.0)
    t = np.clip(np.log(f / c.hot_bytes) / math.log(c.cold_bytes / c.hot_bytes), 0.0, 1.0)
    return (1.0 - t) / hot_bw + t / cold_bw


@dataclass(frozen=True)
class PartTables:
    """The table of each part, as arrays: what the cost formulas read of a :class:`TableSpec`,
    one entry per part, so that the parts of many tables' options are costed in one call
    (:func:`estimate_many`; the enumeration of 1,000 tables makes about 9,000 options).
    ``specs[index[k]]`` is part k's table."""

    specs: Tuple[TableSpec, ...]
    index: np.ndarray
    rows: np.ndarray
    dim: np.ndarray
    weight_bytes: np.ndarray
    state_floats_per_row: np.ndarray
    state_per_element: np.ndarray
    num_features: np.ndarray
    pooling_factor: np.ndarray
    access_skew: np.ndarray
    distinct_per_batch: np.ndarray
    """Measured distinct rows per global batch; NaN: the skew model."""
    weighted_share: np.ndarray
    """Share of the table's features whose ids carry per-id weights (4 bytes each on the wire)."""
    weight_grad_share: np.ndarray
    """Share of its features whose weights require grad (their read and gradient: ``weighted_*``)."""

    @staticmethod
    def of(specs: Sequence[TableSpec], index=None) -> "PartTables":
        """The tables ``specs`` (one entry each), or the parts whose tables are ``specs[index]``."""
        specs = tuple(specs)

        def col(f, dtype=np.float64):
            return np.array([f(t) for t in specs], dtype=dtype)

        T = PartTables(specs, np.arange(len(specs)), col(lambda t: t.rows), col(lambda t: t.dim),
                       col(lambda t: t.weight_bytes), col(lambda t: t.state_floats_per_row),
                       col(lambda t: t.state_per_element, bool), col(lambda t: t.num_features),
                       col(lambda t: t.pooling_factor), col(lambda t: t.access_skew),
                       col(lambda t: np.nan if t.distinct_per_batch is None else t.distinct_per_batch),
                       col(lambda t: t.weighted_share),
                       col(lambda t: t.weighted_share if t.learnable_weights else 0.0))
        return T if index is None else T.take(index)

    def take(self, index) -> "PartTables":
        """Entries ``index`` (of this object's entries)."""
        index = np.asarray(index, dtype=np.int64)
        fields = {f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self) if f.name != "specs"}
        return PartTables(self.specs, **fields)


def _part_tables(table, n: int) -> PartTables:
    """``table`` as the table of each of ``n`` parts (a TableSpec), or itself (PartTables)."""
    return table if isinstance(table, PartTables) else PartTables.of([table], np.zeros(n, np.int64))


def _per_key(fn, *keys: np.ndarray) -> np.ndarray:
    """``fn(*columns)`` (arrays of distinct keys, one column per key array; an array of values)
    for each entry's key, each distinct key computed once: the parts of one split repeat their key
    (a row-wise table's differ by at most one row), so only the first of a run of equal keys is
    looked up."""
    k = np.stack(keys, axis=1)
    if len(k) == 0:
        return np.zeros(0)
    head = np.ones(len(k), dtype=bool)
    head[1:] = (k[1:] != k[:-1]).any(axis=1)
    slot: dict = {}
    which = np.array([slot.setdefault(key, len(slot)) for key in map(tuple, k[head].tolist())], dtype=np.int64)
    distinct = np.array(list(slot), dtype=np.float64).reshape(len(slot), k.shape[1])
    vals = np.asarray(fn(*distinct.T), dtype=np.float64)
    return vals[which][np.cumsum(head) - 1]


def _distinct(T: PartTables, ids: np.ndarray, rows: np.ndarray, global_ids: np.ndarray) -> np.ndarray:
    """Distinct rows among ``ids`` ids of each part (measured, scaled to the part, or the Zipf model);
    ``global_ids``: ids per step of each part's whole table over the global batch."""
    out = np.zeros_like(rows)
    live = (rows > 0) & (ids > 0)
    measured = live & ~np.isnan(T.distinct_per_batch)
    if measured.any():
        r, n, tr = rows[measured], ids[measured], np.maximum(1.0, T.rows[measured])
        full = global_ids[measured] * r / tr
        out[measured] = T.distinct_per_batch[measured] * r / tr * np.minimum(1.0, n / np.maximum(full, 1e-30))
    model = live & np.isnan(T.distinct_per_batch)
    if model.any():
        out[model] = _per_key(lambda r, s, n: np.minimum(r, distinct_per_batch_of(r, s, n)),
                              rows[model], T.access_skew[model], ids[model])
    return out


def lookup_parts(table, bags: np.ndarray, ids: np.ndarray, update_ids: np.ndarray, cols: np.ndarray,
                 rows: np.ndarray, global_ids, c: CostConstants, rank_footprint=None, resident_rows=None,
                 distinct: Optional[np.ndarray] = None):
    """(forward seconds, backward + optimizer seconds, distinct rows updated) per part at speed 1;
    the bandwidths are those of ``rank_footprint`` (bytes of all the tables of each part's rank:
    the fused kernels walk them together), else of the part alone: its ``resident_rows`` (a cached
    part's slots) or all its rows. ``table``: a TableSpec, or each part's (:class:`PartTables`);
    ``distinct``: the parts' distinct rows when known (they do not depend on the footprint)."""
    T = _part_tables(table, len(rows))
    row_b = cols * T.weight_bytes
    state_b = 4.0 * T.state_floats_per_row * np.where(T.state_per_element, cols / T.dim, 1.0)
    foot = (rows if resident_rows is None else resident_rows) * (row_b + state_b)
    if rank_footprint is not None:
        foot = np.maximum(foot, rank_footprint)
    fwd = bags * c.lookup_bag_s + ids * (c.lookup_id_s + row_b * seconds_per_byte(foot, c.lookup_bw_hot,
                                                                                c.lookup_bw_cold, c))
    U = _distinct(T, update_ids, rows, np.broadcast_to(np.asarray(global_ids, dtype=np.float64), rows.shape)) \
        if distinct is None else distinct
    bwd = update_ids * c.update_id_s + U * (c.update_row_s + 2.0 * (row_b + state_b) * seconds_per_byte(
        foot, c.update_bw_hot, c.update_bw_cold, c))
    # learnable per-id weights: their read, and their gradient <row, bag gradient> per id
    bwd = bwd + T.weight_grad_share * (T.num_features * c.weighted_feature_s + bags * c.weighted_bag_s
                                       + ids * c.weighted_id_s)
    return fwd + np.where(rows > 0, c.kernel_overhead, 0.0), bwd, U


def cache_parts(table, ids: np.ndarray, cols: np.ndarray, rows: np.ndarray, fraction: float,
                global_ids, c: CostConstants, distinct: Optional[np.ndarray] = None):
    """(the cache's seconds a step: admission and misses, hit rate, device bytes of cache + index,
    store bytes, distinct rows) per part of a cached table whose parts cache ``fraction`` of their
    rows; ``ids``: ids per step on each part, ``global_ids``: ids per step of the whole table over
    the global batch. ``table``: a TableSpec, or each part's (:class:`PartTables`)."""
    T = _part_tables(table, len(rows))
    row_bytes = cols * T.weight_bytes + 4.0 * T.state_floats_per_row * np.where(T.state_per_element, cols / T.dim, 1.0)
    U = _distinct(T, ids, rows, np.broadcast_to(np.asarray(global_ids, dtype=np.float64), rows.shape)) \
        if distinct is None else distinct
    hit = np.zeros_like(rows)
    live = rows > 0
    if live.any():
        def rates(tables, part_rows, part_ids):
            return [hit_rate(fraction, int(r), T.specs[int(k)].access_skew, n, T.specs[int(k)].hit_curve,
                             T.specs[int(k)].cache_policy, T.specs[int(k)].cache_lookahead)
                    for k, r, n in zip(tables.tolist(), part_rows.tolist(), part_ids.tolist())]

        hit[live] = _per_key(rates, T.index[live].astype(np.float64), rows[live], ids[live])
    miss_s = np.where(rows > 0, c.cache_batch_s, 0.0) + U * c.cache_access_s \
        + U * (1.0 - hit) * (2.0 * row_bytes / c.host_bw + c.cache_miss_latency)
    # slots; the index per row: the row's slot (4 bytes), its batch count (4, lfu and lookahead) and
    # the lookahead window's mask (8, the default policy): the most, 16 (docs/cache.md)
    device = np.ceil(fraction * rows) * (row_bytes + 17.0) + rows * 16.0
    return miss_s, hit, device, rows * row_bytes, U


def estimate_parts(table: TableSpec, stype: ShardingType, rows: np.ndarray, cols: np.ndarray,
                   topo: Topology, c: CostConstants, cache_fraction: Optional[float] = None,
                   rank_footprint=None) -> PartCosts:
    """Costs of each shard (rows[k] x cols[k]) of ``table`` sharded as ``stype``; cached with a
    cache of ``cache_fraction`` of each shard's rows when given, else all rows on the device;
    ``rank_footprint``: device bytes of the tables of each shard's rank (:func:`lookup_parts`)."""
    rows = np.asarray(rows, dtype=np.float64)
    return _estimate_parts_of(_part_tables(table, len(rows)), stype, rows, cols, topo, c, cache_fraction,
                             rank_footprint)


def _estimate_parts_of(T: PartTables, stype: ShardingType, rows: np.ndarray, cols: np.ndarray,
                      topo: Topology, c: CostConstants, cache_fraction: Optional[float] = None,
                      rank_footprint=None, distinct: Optional[np.ndarray] = None) -> PartCosts:
    """:func:`estimate_parts` of parts of many tables at once, all sharded as ``stype`` (and cached
    with ``cache_fraction``): part k is a shard of table ``T.specs[T.index[k]]``."""
    rows = np.asarray(rows, dtype=np.float64)
    cols = np.asarray(cols, dtype=np.float64)
    W, L = topo.world_size, topo.local_world_size
    B = topo.batch_size_per_rank
    G = B * W
    F, P = T.num_features, T.pooling_factor
    a, i_b = c.act_bytes, c.id_bytes + 4.0 * T.weighted_share      # an id's bytes, with its weight or slot
    rho = rows / np.maximum(1.0, T.rows)
    f_intra, f_inter = (L - 1) / W, (W - L) / W
    state_floats = np.where(T.state_per_element, T.state_floats_per_row * cols / T.dim, T.state_floats_per_row)
    weights = rows * cols * T.weight_bytes
    state = rows * state_floats * 4.0
    ones = np.ones_like(rows)

    if stype is ShardingType.DATA_PARALLEL:
        bags, ids, upd = B * F * ones, B * F * P * ones, G * F * P * ones   # pools its own, updates all
        in_bytes = (W - 1) * B * F * P * i_b * ones                           # every rank's ids
        out_bytes = (W - 1) * B * F * cols * a                                # AllGather of the gradients
        b_in = (in_bytes + out_bytes) * (L - 1) / max(1, W - 1) if W > 1 else 0 * ones
        b_out = (in_bytes + out_bytes) - b_in
        comm_in = in_bytes * ((L - 1) / max(1, W - 1) / c.intra_bw + (W - L) / max(1, W - 1) / c.inter_bw)
        comm = comm_in + out_bytes * ((L - 1) / max(1, W - 1) / c.intra_bw + (W - L) / max(1, W - 1) / c.inter_bw)
        buffers = G * F * P * i_b + G * F * cols * a
    elif stype in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        span = W if stype is ShardingType.ROW_WISE else L
        bags, ids = G * F * ones, G * F * P * rho
        upd = ids
        ids_bytes = ids * i_b
        partial = G * F * cols * a  # partial pooled sums of the global batch
        comm_in = ids_bytes * f_intra / c.intra_bw + ids_bytes * f_inter / c.inter_bw
        if stype is ShardingType.ROW_WISE:
            rs_in, rs_out, rs_t = _hier_collective(partial, topo, c)
            b_in = ids_bytes * f_intra + 2 * rs_in
            b_out = ids_bytes * f_inter + 2 * rs_out
            comm = comm_in + 2 * rs_t
        else:  # intra-node RS of the partial sums, then the node's 1/L share goes out by AlltoAll
            rs = partial * (span - 1) / span
            out = 2 * partial / span
            b_in = (ids_bytes + out) * f_intra + 2 * rs
            b_out = (ids_bytes + out) * f_inter
            comm = b_in / c.intra_bw + b_out / c.inter_bw
        buffers = ids_bytes + 2 * partial
    else:  # TW, CW, TWCW: the owner serves the whole global batch for its columns
        bags, ids = G * F * ones, G * F * P * ones
        upd = ids
        ids_bytes = ids * i_b
        out = 2 * G * F * cols * a
        b_in = (ids_bytes + out) * f_intra
        b_out = (ids_bytes + out) * f_inter
        comm_in = ids_bytes * f_intra / c.intra_bw + ids_bytes * f_inter / c.inter_bw
        comm = b_in / c.intra_bw + b_out / c.inter_bw
        buffers = ids_bytes + out
    slots = None if cache_fraction is None else np.ceil(cache_fraction * rows)     # what a cached part's kernels walk
    fwd, bwd, U = lookup_parts(T, bags, ids, upd, cols, rows, G * F * P, c, rank_footprint, slots, distinct)
    if cache_fraction is None:
        return PartCosts(fwd + bwd, comm, weights + state + buffers, np.zeros_like(rows), b_in, b_out,
                         distinct=U, fwd=fwd, bwd=bwd, comm_in=comm_in)
    miss_s, hit, device, store, _ = cache_parts(T, upd, cols, rows, cache_fraction, G * F * P, c, U)
    return PartCosts(fwd + bwd + miss_s, comm, device + buffers, store, b_in, b_out, hit, miss_s, U,
                     fwd, bwd, comm_in)


def estimate_many(tables: Sequence[TableSpec], requests: Sequence[tuple], topo: Topology,
                  c: CostConstants) -> List[PartCosts]:
    """:func:`estimate_parts` of each request ``(table index, sharding type, rows, cols,
    cache_fraction, rank_footprint or None[, distinct rows])``, the parts of all requests of one
    sharding type and cache share costed in one call (the same numbers as one by one: the formulas
    work per part). The distinct rows, when every request of a call has them (an option's
    ``costs.distinct``, costed before), are not counted again."""
    out: List[Optional[PartCosts]] = [None] * len(requests)
    for members, ends, sizes, pc in _costed_groups(tables, requests, topo, c):
        for k, e, n in zip(members, ends, sizes):
            out[k] = PartCosts(*[None if v is None else v[e - n:e] for v in (getattr(pc, f) for f in _FIELDS)])
    return out


def estimate_joined(tables: Sequence[TableSpec], requests: Sequence[tuple], topo: Topology, c: CostConstants,
                    fields: Sequence[str]) -> List[np.ndarray]:
    """The ``fields`` of :func:`estimate_many`'s costs, each one array of every request's parts in
    the requests' order (what a plan sums per rank: no object per request)."""
    starts = np.cumsum([0] + [len(r[2]) for r in requests])
    out = [np.empty(int(starts[-1])) for _ in fields]
    for members, _, sizes, pc in _costed_groups(tables, requests, topo, c):
        where = np.concatenate([np.arange(starts[k], starts[k] + n) for k, n in zip(members, sizes)])
        for o, f in zip(out, fields):
            o[where] = getattr(pc, f)
    return out


def _costed_groups(tables: Sequence[TableSpec], requests: Sequence[tuple], topo: Topology, c: CostConstants):
    """(requests, their parts' ends, sizes, PartCosts of their parts) for the requests of each sharding
    type and cache share, costed in one call."""
    columns = PartTables.of(tables)
    groups: dict = {}
    for k, (_, stype, _, _, fraction, *_) in enumerate(requests):
        groups.setdefault((stype, fraction), []).append(k)
    for (stype, fraction), members in groups.items():
        sizes = [len(requests[k][2]) for k in members]
        ends = np.cumsum(sizes).tolist()
        index = np.repeat([requests[k][0] for k in members], sizes)
        rows = np.concatenate([np.asarray(requests[k][2], dtype=np.float64) for k in members])
        cols = np.concatenate([np.asarray(requests[k][3], dtype=np.float64) for k in members])
        # a part's own bytes are never below 0: no rank footprint is a footprint of 0
        feet = [0.0 if requests[k][5] is None else requests[k][5] for k in members]
        if all(np.ndim(f) == 0 for f in feet):
            foot = np.repeat(np.array(feet, dtype=np.float64), sizes)
        else:
            foot = np.concatenate([np.broadcast_to(np.asarray(f, dtype=np.float64), (n,)) for f, n in zip(feet, sizes)])
        known = [requests[k][6] if len(requests[k]) > 6 else None for k in members]
        distinct = None if any(d is None for d in known) else np.concatenate(known)
        yield members, ends, sizes, _estimate_parts_of(columns.take(index), stype, rows, cols, topo, c, fraction,
                                                       foot, distinct)


_FIELDS = tuple(f.name for f in dataclasses.fields(PartCosts))


def input_side_cost(table: TableSpec, stype: ShardingType, topo: Topology, c: CostConstants):
    """Per-rank (seconds, bytes_intra, bytes_inter, hbm bytes) that every rank pays for
    ``table`` independent of placement: sending its local ids and receiving its local
    pooled outputs (and sending their gradients back). Zero for data-parallel."""
    s_in, s_out, b_in, b_out, mem = input_side_split(table, stype, topo, c)
    return s_in + s_out, b_in, b_out, mem


def input_side_split(table: TableSpec, stype: ShardingType, topo: Topology, c: CostConstants):
    """(input distribution s, output distribution s, bytes intra, bytes inter, hbm bytes) of the
    input side; the output part includes the kind's code-path overhead per bag of the global batch
    (``row_wise_overhead``...; none for table-wise or in one process)."""
    W, L, B = topo.world_size, topo.local_world_size, topo.batch_size_per_rank
    F, P, D = table.num_features, table.pooling_factor, table.dim
    kind = getattr(c, KIND_OVERHEADS[stype.value]) * W * B * F if W > 1 and stype.value in KIND_OVERHEADS else 0.0
    if stype is ShardingType.DATA_PARALLEL:
        return 0.0, kind, 0.0, 0.0, 0.0
    ids, pooled = B * F * P * (c.id_bytes + 4.0 * table.weighted_share), 2 * B * F * D * c.act_bytes
    fi, fo = (L - 1) / W, (W - L) / W
    s_in = ids * (fi / c.intra_bw + fo / c.inter_bw)
    s_out = pooled * (fi / c.intra_bw + fo / c.inter_bw)
    return s_in, s_out + kind, (ids + pooled) * fi, (ids + pooled) * fo, B * F * D * c.act_bytes * 2.0


def collective_latency(types_used, topo: Topology, c: CostConstants) -> float:
    """Fixed latency per step of the (fused) collectives the plan uses; the same on every rank."""
    return sum(collective_latency_split(types_used, topo, c))


def collective_latency_split(types_used, topo: Topology, c: CostConstants):
    """(input distribution, output distribution) latency per step: 0 in one process. CPU ranks on
    one host carry a plan's several output distributions in one AlltoAll per direction (the
    runtime's default, ``sharding.fuse_output_dists``): two collectives."""
    if topo.world_size == 1:
        return 0.0, 0.0
    lat = c.inter_latency if topo.num_nodes > 1 else c.intra_latency
    used = set(types_used)
    n_in = 2 if used else 0                     # lengths + ids AlltoAlls, shared by every type
    n_out = 0
    if used & {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE}:
        n_out += 2                              # pooled AlltoAll forward + backward
    if ShardingType.ROW_WISE in used:
        n_out += 2                              # ReduceScatter, AllGather
    if ShardingType.TABLE_ROW_WISE in used:
        n_out += 3
    if ShardingType.TABLE_COLUMN_WISE in used:
        n_out += 2
    if ShardingType.DATA_PARALLEL in used:
        n_out += 1                              # AllGather of the gradients
    if topo.num_nodes == 1 and c.device_kind == "cpu" and len({t.output_group for t in used}) > 1:
        n_out = 2                               # one AlltoAll per direction for every type (sharding/one_host.py)
    return n_in * lat, n_out * lat
