"""Cost model: per-shard lookup time, communication time and bytes, memory.

Formulas (docs/planner.md has the derivation). Notation: B = batch per rank, W ranks,
L ranks per node, N = W / L nodes, G = B * W global batch, F features of the table,
P pooling factor, D dim, s weight bytes, c shard columns, rho = shard rows / table rows,
a = activation bytes (fp32), i = id bytes, BW_hbm = hbm_bw * hbm_efficiency.

- Lookup (forward):  ids_on_shard * c * s / (BW_hbm * speed), ids_on_shard = G*F*P*rho
  (the owner of a model-parallel shard serves the global batch; ids assumed spread over
  row blocks uniformly, e.g. hashed). Backward + fused optimizer = ``bwd_factor`` x forward.
  Host (UVM) placement: the fraction ``h`` of lookups hitting the HBM cache go at BW_hbm,
  the rest at ``host_bw``; ``h`` follows a Zipf(access_skew) law on the cached rows.
- ids AlltoAll: the owner receives G*F*P*rho*i bytes, (L-1)/W of them from its own node
  (intra-node bandwidth) and (W-L)/W from other nodes (inter-node bandwidth).
- pooled AlltoAll (forward) and its gradient (backward): 2*G*F*c*a bytes, same split.
- row-wise ReduceScatter (forward) + AllGather (backward) of the G*F*D partial sums,
  hierarchical: 2 * V*(L-1)/L at intra bandwidth + 2 * (V/L)*(N-1)/N at inter bandwidth.
- data-parallel AllReduce of the dense gradient (rows*D*a bytes): the same hierarchical
  ring, 2(W-1)/W bytes per byte overall (RS + AG).
- Memory: weights rows*c*s + optimizer state rows*state*4 + I/O buffers (ids received,
  pooled outputs and their gradients); DP adds a dense fp32 gradient buffer.

Every rank also sends its own ids and receives the pooled outputs of every model-parallel
table for its local batch (the "input side"); that is the same on every rank and is
returned by :func:`input_side_cost` so that it appears in the predicted time.

References: Mudigere et al., ISCA 2022 (Neo), Sec. 4: cost = communication + load
imbalance; TorchRec ``shard_estimators.py`` (EmbeddingPerfEstimator) for the split into
forward/backward compute and input/output communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from neo.planner.types import CostConstants, Placement, ShardingType, TableSpec, Topology

__all__ = ["PartCosts", "estimate_parts", "input_side_cost", "zipf_hit_rate", "collective_latency"]


@dataclass(frozen=True)
class PartCosts:
    """Costs of the shards (parts) of one sharding option; arrays of equal length.

    ``compute`` is seconds at speed 1.0 (divide by the device speed); ``comm`` seconds.
    """

    compute: np.ndarray
    comm: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    bytes_intra: np.ndarray
    bytes_inter: np.ndarray


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


def _lookup_seconds(table: TableSpec, ids: np.ndarray, cols: np.ndarray, rows: np.ndarray,
                    placement: Placement, c: CostConstants) -> np.ndarray:
    """Forward + backward lookup time at speed 1 for ``ids`` ids on shards of ``cols`` columns."""
    nbytes = ids * cols * table.weight_bytes
    if placement is Placement.HOST:
        hit = np.array([zipf_hit_rate(c.cache_load_factor * r, int(r), table.access_skew) for r in rows])
        fwd = nbytes * (hit / c.lookup_bw + (1.0 - hit) / c.host_bw)
    else:
        fwd = nbytes / c.lookup_bw
    return fwd * (1.0 + c.bwd_factor) + np.where(rows > 0, c.kernel_overhead, 0.0)


def estimate_parts(table: TableSpec, stype: ShardingType, rows: np.ndarray, cols: np.ndarray,
                   topo: Topology, c: CostConstants, placement: Placement = Placement.DEVICE) -> PartCosts:
    """Costs of each shard (rows[k] x cols[k]) of ``table`` sharded as ``stype``."""
    rows = np.asarray(rows, dtype=np.float64)
    cols = np.asarray(cols, dtype=np.float64)
    W, L = topo.world_size, topo.local_world_size
    B = topo.batch_size_per_rank
    G = B * W
    F, P, D = table.num_features, table.pooling_factor, table.dim
    a, i_b = c.act_bytes, c.id_bytes
    rho = rows / max(1, table.rows)
    f_intra, f_inter = (L - 1) / W, (W - L) / W
    zeros = np.zeros_like(rows)
    if table.state_per_element:
        state_floats = table.state_floats_per_row * cols / table.dim
    else:
        state_floats = np.full_like(cols, float(table.state_floats_per_row))
    weights = rows * cols * table.weight_bytes
    state = rows * state_floats * 4.0

    if stype is ShardingType.DATA_PARALLEL:
        ids = B * F * P * np.ones_like(rows)
        compute = _lookup_seconds(table, ids, cols, rows, placement, c)
        # dense optimizer step over the whole replica after the AllReduce (read+write weights and state)
        compute = compute + 2.0 * (weights + state) / c.lookup_bw
        grad = rows * cols * a
        b_in, b_out, t = _hier_collective(grad, topo, c)
        b_in, b_out, t = 2 * b_in, 2 * b_out, 2 * t  # RS + AG
        buffers = B * F * P * i_b + grad
        hbm, host = weights + state + buffers, zeros
        if placement is Placement.HOST:
            hbm, host = c.cache_load_factor * weights + buffers, weights + state
        return PartCosts(compute, t, hbm, host, b_in, b_out)

    if stype in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        span = W if stype is ShardingType.ROW_WISE else L
        ids = G * F * P * rho
        compute = _lookup_seconds(table, ids, cols, rows, placement, c)
        ids_bytes = ids * i_b
        partial = G * F * cols * a  # partial pooled sums of the global batch
        if stype is ShardingType.ROW_WISE:
            rs_in, rs_out, rs_t = _hier_collective(partial, topo, c)
            b_in = ids_bytes * f_intra + 2 * rs_in
            b_out = ids_bytes * f_inter + 2 * rs_out
            comm = ids_bytes * f_intra / c.intra_bw + ids_bytes * f_inter / c.inter_bw + 2 * rs_t
        else:  # intra-node RS of the partial sums, then the node's 1/L share goes out by AlltoAll
            rs = partial * (span - 1) / span
            out = 2 * partial / span
            b_in = (ids_bytes + out) * f_intra + 2 * rs
            b_out = (ids_bytes + out) * f_inter
            comm = b_in / c.intra_bw + b_out / c.inter_bw
        buffers = ids_bytes + 2 * partial
    else:  # TW, CW, TWCW: the owner serves the whole global batch for its columns
        ids = G * F * P * np.ones_like(rows)
        compute = _lookup_seconds(table, ids, cols, rows, placement, c)
        ids_bytes = ids * i_b
        out = 2 * G * F * cols * a
        b_in = (ids_bytes + out) * f_intra
        b_out = (ids_bytes + out) * f_inter
        comm = b_in / c.intra_bw + b_out / c.inter_bw
        buffers = ids_bytes + out
    hbm, host = weights + state + buffers, zeros
    if placement is Placement.HOST:
        hbm, host = c.cache_load_factor * weights + buffers, weights + state
    return PartCosts(compute, comm, hbm, host, b_in, b_out)


def input_side_cost(table: TableSpec, stype: ShardingType, topo: Topology, c: CostConstants):
    """Per-rank (seconds, bytes_intra, bytes_inter, hbm bytes) that every rank pays for
    ``table`` independent of placement: sending its local ids and receiving its local
    pooled outputs (and sending their gradients back). Zero for data-parallel."""
    if stype is ShardingType.DATA_PARALLEL:
        return 0.0, 0.0, 0.0, 0.0
    W, L, B = topo.world_size, topo.local_world_size, topo.batch_size_per_rank
    F, P, D = table.num_features, table.pooling_factor, table.dim
    vol = B * F * P * c.id_bytes + 2 * B * F * D * c.act_bytes
    b_in, b_out = vol * (L - 1) / W, vol * (W - L) / W
    return b_in / c.intra_bw + b_out / c.inter_bw, b_in, b_out, B * F * D * c.act_bytes * 2.0


def collective_latency(types_used, topo: Topology, c: CostConstants) -> float:
    """Fixed latency per step of the (fused) collectives the plan uses; the same on every rank."""
    lat = c.inter_latency if topo.num_nodes > 1 else c.intra_latency
    n = 0
    used = set(types_used)
    if used & {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE}:
        n += 4  # ids AlltoAll (2: lengths + values), pooled AlltoAll fwd + bwd
    if ShardingType.ROW_WISE in used:
        n += 4  # ids AlltoAll (2), ReduceScatter, AllGather
    if ShardingType.TABLE_ROW_WISE in used:
        n += 5
    if ShardingType.DATA_PARALLEL in used:
        n += 1
    return n * lat
