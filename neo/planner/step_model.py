"""A training step, predicted: the embeddings' plan and the dense part, in the trainer's components.

The sharding plan predicts each rank's embedding work (forward lookups, fused backward +
optimizer) and communication (input distribution: the ids; output distribution: pooled
embeddings, their gradients, row-wise reductions, data-parallel gathers). Ranks meet at every
collective, so a step lasts as long as the busiest rank's embedding work and communication,
plus the dense part every rank runs alike:

    step = max_r (fwd_r + bwd_r + in_r + out_r) + dense + step_overhead

with the components of the busiest rank. Dense part (:class:`DenseSpec`, per rank, B samples):
the MLPs (6 B in out flops per layer: forward, input and weight gradients) at ``dense_flops``
plus ``dense_layer_s`` per layer and ``dense_elem_s`` per activation element (B (in + out) a
layer: bias, ReLU, copies); the interaction (dot: pairs of the F + 1 vectors; DCNv2: the
low-rank cross layers) at ``interaction_flops``; the dense optimizer's pass over parameters and
state at ``dense_optimizer_bw``; the pooled embeddings' way into the model and their
gradients' way back (``pooled_elem_s`` per element of the B x F x D input); with W > 1 ranks,
DDP's AllReduce of the gradients (25 MiB buckets, ``allreduce_latency`` each,
``allreduce_bw``: the reduction training runs, which on one CPU host is the shared-memory hook of
:mod:`neo.distributed.ddp_hook`, tens of microseconds a bucket; across nodes no faster than the
network's ``inter_latency`` and ``inter_bw``, which a ring over the nodes crosses). Data loading
(per batch, bag and id: :func:`data_seconds`) runs ahead on each rank's loader thread, off the
path; loaded inline (``data.prefetch_batches: 0``) it is on the path, as ``data`` (``inline_data``).

A cached table's work of a step (its batch's admission and moves, :mod:`neo.planner.cost`) runs
on the cache's worker thread while the step before computes: off the path, as the trainer
measures it (its ``embedding_bwd`` is the fused backward alone). A rank's cached tables take
their turns on one thread, so a step lasts at least their sum on the busiest rank; where it is
longer than the path, the lookup waits for the prefetch (``embedding_fwd``, where the trainer
counts that wait). On a CPU the work also takes the node's cores, as the loaders' does.

On a CPU a node's cores run everything: every rank's lookups, backward, dense part and loop,
each x the rank's threads, and each loader's work. A step lasts at least that over the node's
cores (:func:`cpu_bound_step`). The busiest rank's path has idle time where it waits in a collective
(latency, a slower peer); loader threads fill it, and the step pays for them only where the
cores have none left. Ranks that outnumber the cores (4 on this project's 2-core VM) take turns
the same way. Where the bound is longer than the path, the critical rank's compute components
stretch to fill it (its collectives' time does not: a rank waiting in one leaves its core to the
others); ``data`` stays what the path pays (0 with a loader thread), as the trainer measures it
(the wait for a batch). The per-call constants are measured with every rank busy at once but
timed by medians, which leave out the calls a rank was descheduled in: the stretch is not in
them. Pure numpy; the constants are ``neo calibrate``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from neo.planner.constants import CostConstants
from neo.planner.cost import collective_latency_split, estimate_parts, input_side_split
from neo.planner.plan import Plan
from neo.planner.types import Placement, TableSpec, Topology

__all__ = ["DenseSpec", "StepPrediction", "dense_seconds", "data_seconds", "predict_step",
           "rank_footprints", "cpu_bound_step", "COMPONENTS", "COMPUTING"]

COMPONENTS = ("embedding_fwd", "embedding_bwd", "input_dist", "output_dist", "dense", "data")
COMPUTING = ("embedding_fwd", "embedding_bwd", "dense", "data", "other")
"""The components a rank spends on the cores (the rest is collectives): where ranks outnumber a
node's cores, these stretch (:func:`predict_step`)."""
_BUCKET = 25 * 2**20                    # DDP's default bucket (bytes)


@dataclass(frozen=True)
class DenseSpec:
    """The dense part of a DLRM / DCNv2 (``model`` section, tables' F and D)."""

    num_dense: int
    bottom: Tuple[int, ...]
    top: Tuple[int, ...]
    num_features: int
    dim: int
    interaction: str = "dot"
    dcn_layers: int = 3
    dcn_rank: int = 512
    optimizer_state_floats: int = 1
    """Dense optimizer state per parameter: sgd 0, adagrad 1, adam 2."""

    @property
    def interaction_width(self) -> int:
        n = self.num_features + 1
        return self.dim + n * (n - 1) // 2 if self.interaction == "dot" else n * self.dim

    def layers(self) -> List[Tuple[int, int]]:
        """(in, out) of every Linear: bottom, cross layers' two factors, top."""
        out, width = [], self.num_dense
        for w in self.bottom:
            out.append((width, w))
            width = w
        if self.interaction == "dcn":
            e = self.interaction_width
            out += [(e, self.dcn_rank), (self.dcn_rank, e)] * self.dcn_layers
        width = self.interaction_width
        for w in self.top:
            out.append((width, w))
            width = w
        return out

    @property
    def params(self) -> int:
        return sum(i * o + o for i, o in self.layers())

    def activation_elems(self, batch: int) -> float:
        """Elements the MLP layers read and write besides their products: ``batch x (in + out)``
        a layer (its input and output activations; their gradients follow them)."""
        return float(batch) * sum(i + o for i, o in self.layers())

    def flops(self, batch: int) -> Tuple[float, float]:
        """(matmul flops, interaction flops) of forward + backward for ``batch`` samples."""
        mm = 6.0 * batch * sum(i * o for i, o in self.layers())
        n = self.num_features + 1
        if self.interaction == "dot":
            inter = 3.0 * batch * n * (n - 1) * self.dim            # pairs x D x 2, forward and backward
        else:
            inter = 3.0 * batch * self.interaction_width * 4 * self.dcn_layers
        return mm, inter


@dataclass(frozen=True)
class StepPrediction:
    """Milliseconds of a step and its components (``COMPONENTS`` + ``other``), per rank."""

    step_ms: float
    components_ms: Dict[str, float]
    critical_rank: int
    samples_per_s: float
    rank_ms: Tuple[float, ...]
    """Each rank's embedding work + communication (ms) on its path, before the dense part (a cached
    table's prefetch, beside the path, not included)."""

    def to_dict(self) -> Dict[str, object]:
        return {"step_ms": round(self.step_ms, 4), "components_ms": {k: round(v, 4) for k, v in
                                                                     self.components_ms.items()},
                "critical_rank": self.critical_rank, "samples_per_s": round(self.samples_per_s, 1),
                "rank_ms": [round(x, 4) for x in self.rank_ms]}


def dense_seconds(spec: DenseSpec, batch: int, world_size: int, c: CostConstants, nodes: int = 1) -> float:
    """Seconds of the dense part of a step on one rank (see the module docstring); ``nodes``: the
    hosts the ranks span (more than one: the AllReduce's terms no faster than the network's)."""
    mm, inter = spec.flops(batch)
    t = mm / c.dense_flops + inter / c.interaction_flops + (len(spec.layers()) + 1) * c.dense_layer_s
    t += spec.activation_elems(batch) * c.dense_elem_s
    t += spec.params * 4.0 * (2 + 2 * spec.optimizer_state_floats) / c.dense_optimizer_bw
    t += batch * spec.num_features * spec.dim * c.pooled_elem_s
    if world_size > 1:
        grad = spec.params * 4.0
        latency, bw = c.allreduce_latency, c.allreduce_bw
        if nodes > 1:
            latency, bw = max(latency, c.inter_latency), min(bw, c.inter_bw)
        t += math.ceil(grad / _BUCKET) * latency + grad * 2 * (world_size - 1) / world_size / bw
    return t


def data_seconds(tables: Sequence[TableSpec], batch: int, c: CostConstants) -> float:
    """Loader CPU seconds of one rank's batch: per batch, per bag and per sparse id (every feature's)."""
    bags = sum(t.num_features for t in tables)
    ids = sum(t.num_features * t.pooling_factor for t in tables)
    return c.data_batch_s + batch * (bags * c.data_bag_s + ids * c.data_id_s)


def _cache_fraction(tp, c: CostConstants):
    if tp.placement is not Placement.CACHED:
        return None
    return tp.cache_load_factor if tp.cache_load_factor is not None else c.cache_load_factor


def rank_footprints(table_plans, tables: Sequence[TableSpec], world_size: int, c: CostConstants) -> np.ndarray:
    """(W,) bytes of embedding rows and optimizer state each rank's fused kernels walk: its shards'
    (a cached shard's cache slots only); ``table_plans``: name -> TablePlan (``Plan.tables``)."""
    by_name = {t.name: t for t in tables}
    out = np.zeros(world_size)
    for name, tp in table_plans.items():
        t, frac = by_name[name], _cache_fraction(tp, c)
        for s in tp.shards:
            out[s.rank] += math.ceil(s.rows * (frac if frac is not None else 1.0)) * t.bytes_per_row(s.cols)
    return out


def cpu_bound_step(compute: np.ndarray, data_s: float, local_ranks: int, cores: int, threads_per_rank: int) -> float:
    """Seconds a CPU node needs for its ranks' work when they share its cores: each rank's
    compute seconds (``compute``, (W,), measured with the rank on its own cores) x its threads,
    plus each loader's ``data_s``, over the node's ``cores``; the busiest node's (0 without cores)."""
    if cores <= 0:
        return 0.0
    per_node = compute.reshape(-1, local_ranks) * max(1, threads_per_rank) + data_s
    return float(per_node.sum(axis=1).max()) / cores


def predict_step(plan: Plan, tables: Sequence[TableSpec], dense: DenseSpec, topo: Topology,
                 c: CostConstants, inline_data: bool = False, cores: int = 0,
                 threads_per_rank: int = 1) -> StepPrediction:
    """The step time of ``plan`` with ``dense`` on ``topo`` (see the module docstring); with
    ``inline_data`` the loader's work is on the path as ``data`` (``data.prefetch_batches: 0``),
    else it runs on its own thread, off the path. On a CPU (``c.device_kind == "cpu"``) whose nodes
    have ``cores`` cores for ranks of ``threads_per_rank`` threads, the step lasts at least the
    nodes' work over their cores (:func:`cpu_bound_step`: compute and the loaders), and the
    critical rank's compute components stretch to fill that time."""
    W = topo.world_size
    speed = np.array([d.speed for d in topo.devices], dtype=np.float64)
    comp = {k: np.zeros(W) for k in ("fwd", "bwd", "in", "out", "cache")}
    by_name = {t.name: t for t in tables}
    foot = rank_footprints(plan.tables, tables, W, c)
    used = []
    for name, tp in plan.tables.items():
        t = by_name[name]
        used.append(tp.sharding_type)
        sh = tp.shards
        rows = np.array([s.rows for s in sh], dtype=np.float64)
        cols = np.array([s.cols for s in sh], dtype=np.float64)
        ranks = np.array([s.rank for s in sh], dtype=np.int64)
        pc = estimate_parts(t, tp.sharding_type, rows, cols, topo, c, _cache_fraction(tp, c), foot[ranks])
        np.add.at(comp["fwd"], ranks, pc.fwd / speed[ranks])
        np.add.at(comp["bwd"], ranks, pc.bwd / speed[ranks])
        if pc.miss_seconds is not None:
            np.add.at(comp["cache"], ranks, pc.miss_seconds / speed[ranks])
        np.add.at(comp["in"], ranks, pc.comm_in)
        np.add.at(comp["out"], ranks, pc.comm - pc.comm_in)
        s_in, s_out, _, _, _ = input_side_split(t, tp.sharding_type, topo, c)
        comp["in"] += s_in
        comp["out"] += s_out
    lat_in, lat_out = collective_latency_split(used, topo, c)
    comp["in"] += lat_in + c.input_dist_overhead
    comp["out"] += lat_out + c.output_dist_overhead
    holds = np.zeros(W, dtype=bool)
    for tp in plan.tables.values():
        holds[[s.rank for s in tp.shards]] = True
    comp["fwd"] += np.where(holds, c.lookup_call_s / 2, 0.0)
    comp["bwd"] += np.where(holds, c.lookup_call_s / 2, 0.0)
    weighted = np.zeros(W, dtype=bool)                # ranks with learnable per-id weights to read
    for name, tp in plan.tables.items():
        if by_name[name].learnable_weights:
            weighted[[s.rank for s in tp.shards]] = True
    comp["bwd"] += np.where(weighted, c.weighted_call_s, 0.0)
    per_rank = comp["fwd"] + comp["bwd"] + comp["in"] + comp["out"]
    r = int(np.argmax(per_rank))
    d = dense_seconds(dense, topo.batch_size_per_rank, W, c, nodes=W // topo.local_world_size)
    data_s = data_seconds(tables, topo.batch_size_per_rank, c)
    parts = {"embedding_fwd": comp["fwd"][r], "embedding_bwd": comp["bwd"][r], "input_dist": comp["in"][r],
             "output_dist": comp["out"][r], "dense": d, "data": data_s if inline_data else 0.0, "other": c.step_overhead}
    step = sum(parts.values())
    prefetch = float(comp["cache"].max())       # the busiest cache thread: the step waits for it
    if prefetch > step:
        parts["embedding_fwd"] += prefetch - step
        step = prefetch
    if c.device_kind == "cpu" and cores > 0:
        own = comp["fwd"] + comp["bwd"] + comp["cache"] + d + c.step_overhead
        shared = cpu_bound_step(own, data_s, topo.local_world_size, cores, threads_per_rank)
        busy = sum(parts[k] for k in COMPUTING)
        if shared > step and busy > 0:
            stretch = (shared - (step - busy)) / busy
            parts.update({k: parts[k] * stretch for k in COMPUTING})
            step = sum(parts.values())
    return StepPrediction(step * 1e3, {k: v * 1e3 for k, v in parts.items()}, r,
                          topo.batch_size_per_rank * W / step, tuple(float(x) * 1e3 for x in per_rank))
