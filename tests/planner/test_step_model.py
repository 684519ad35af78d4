"""The step model's two host effects: a rank's tables share its caches (the bandwidths follow the
rank's footprint), and ranks that outnumber a CPU node's cores take turns."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from neo.planner import Placement, Plan, ShardingType, Topology, plan_tables
from neo.planner.constants import builtin_constants
from neo.planner.cost import estimate_parts, lookup_parts, seconds_per_byte
from neo.planner.step_model import DenseSpec, cpu_bound_step, data_seconds, predict_step, rank_footprints
from neo.planner.types import TableConstraints, TableSpec

CPU = replace(builtin_constants("cpu"), hot_bytes=1e6, cold_bytes=1e9, lookup_bw_hot=50e9, lookup_bw_cold=5e9,
              update_bw_hot=40e9, update_bw_cold=4e9)


def _tw(name: str, rows: int, rank: int, dim: int = 64) -> TableSpec:
    return TableSpec(name, rows, dim, state_floats_per_row=dim, state_per_element=True, pooling_factor=4.0,
                     constraints=TableConstraints((ShardingType.TABLE_WISE,), ranks=(rank,)))


def _plan(tables, W: int, B: int = 1024):
    topo = replace(Topology.uniform(W, W), batch_size_per_rank=B)
    return plan_tables(tables, topo, CPU), topo


def test_a_tables_lookups_slow_down_with_the_other_tables_on_its_rank():
    """The same small table costs more beside a large one (its rows compete with the large
    table's for the caches): the bandwidth is that of the rank's footprint, by the formula."""
    small = _tw("small", 2_000, 0)
    alone, topo = _plan([small], 2)
    beside, _ = _plan([small, _tw("big", 2_000_000, 0)], 2)
    elsewhere, _ = _plan([small, _tw("big", 2_000_000, 1)], 2)
    foot = rank_footprints(beside.tables, [small, _tw("big", 2_000_000, 0)], 2, CPU)
    assert foot[0] == pytest.approx((2_000 + 2_000_000) * 64 * 8) and foot[1] == 0

    def parts(plan, tables):
        f = rank_footprints(plan.tables, tables, 2, CPU)
        sh = plan.tables["small"].shards
        return estimate_parts(small, ShardingType.TABLE_WISE, np.array([sh[0].rows]), np.array([sh[0].cols]), topo,
                              CPU, None, f[[s.rank for s in sh]])

    a = parts(alone, [small])
    b = parts(beside, [small, _tw("big", 2_000_000, 0)])
    e = parts(elsewhere, [small, _tw("big", 2_000_000, 1)])
    assert b.fwd[0] > a.fwd[0] and b.bwd[0] > a.bwd[0]
    assert e.fwd[0] == pytest.approx(a.fwd[0]) and e.bwd[0] == pytest.approx(a.bwd[0])
    ids = 2 * 1024 * 4.0                                      # the global batch's ids, served by the owner
    row = 64 * 4.0
    spb = seconds_per_byte(np.array([foot[0]]), CPU.lookup_bw_hot, CPU.lookup_bw_cold, CPU)[0]
    spb0 = seconds_per_byte(np.array([2_000 * 64 * 8.0]), CPU.lookup_bw_hot, CPU.lookup_bw_cold, CPU)[0]
    assert b.fwd[0] - a.fwd[0] == pytest.approx(ids * row * (spb - spb0), rel=1e-9)


def test_lookup_parts_without_a_rank_footprint_uses_the_parts_own():
    t = _tw("t", 100_000, 0)
    one = np.array([1.0])
    args = (t, 1024 * one, 4096 * one, 4096 * one, 64 * one, 100_000 * one, 4096.0, CPU)
    own = lookup_parts(*args)
    same = lookup_parts(*args, rank_footprint=np.array([100_000 * 64 * 8.0]))
    smaller = lookup_parts(*args, rank_footprint=np.array([1.0]))      # never below the part's own bytes
    for x, y, z in zip(own, same, smaller):
        assert x[0] == pytest.approx(y[0]) == pytest.approx(z[0])


def _four_ranks_on(cores: int, kind: str = "cpu", threads: int = 1):
    c = replace(CPU, device_kind=kind, data_batch_s=1e-3, data_bag_s=0.0, data_id_s=0.0)
    tables = [_tw(f"t{r}", 200_000, r) for r in range(4)]
    plan, topo = _plan(tables, 4)
    dense = DenseSpec(13, (64, 64), (64, 1), num_features=4, dim=64)
    base = predict_step(plan, tables, dense, topo, c, inline_data=True)
    shared = predict_step(plan, tables, dense, topo, c, inline_data=True, cores=cores, threads_per_rank=threads)
    return base, shared, plan, tables, topo, c, dense


def test_ranks_that_outnumber_the_cores_take_turns():
    """4 ranks, 1 thread each, on 2 cores: the step is the node's compute over 2 cores, the
    critical rank's compute components stretched to it (its collectives' time unchanged); the
    components still add up to the step."""
    base, shared, plan, tables, topo, c, dense = _four_ranks_on(2)
    comp = shared.components_ms
    assert sum(comp.values()) == pytest.approx(shared.step_ms, rel=1e-12)
    for k in ("input_dist", "output_dist"):
        assert comp[k] == pytest.approx(base.components_ms[k], rel=1e-12)
    busy = ("embedding_fwd", "embedding_bwd", "dense", "data", "other")
    stretch = {k: comp[k] / base.components_ms[k] for k in busy if base.components_ms[k] > 0}
    assert len(set(round(v, 9) for v in stretch.values())) == 1 and next(iter(stretch.values())) > 1
    # the node's compute: every rank's lookups, dense part and loop, and each loader's batch
    dense_s = base.components_ms["dense"] / 1e3
    own = []
    for r in range(4):
        one = replace(plan, tables={n: tp for n, tp in plan.tables.items() if tp.shards[0].rank == r})
        p = predict_step(one, tables, dense, topo, c)
        # the rank alone: its path minus what it does not compute
        own.append((p.components_ms["embedding_fwd"] + p.components_ms["embedding_bwd"]) / 1e3)
    expect = cpu_bound_step(np.array(own) + dense_s + c.step_overhead, data_seconds(tables, 1024, c), 4, 2, 1)
    assert shared.step_ms == pytest.approx(expect * 1e3, rel=1e-9)
    assert expect == pytest.approx((sum(own) + 4 * (dense_s + c.step_overhead + 1e-3)) / 2, rel=1e-12)


def test_a_loader_thread_fills_the_waits_and_is_paid_beyond_them():
    """2 ranks of 1 thread on 2 cores, each loader on its own thread: the
    loaders' work is off the path and fills the cores' idle time first (here the ranks' time in
    their collectives, the same on both ranks of this symmetric plan); beyond it the step is the
    node's work over its cores, and ``data`` stays 0 (the trainer's wait for a batch). Loaded
    inline (``inline_data``), the path pays all of it."""
    tables = [_tw("a", 100_000, 0), _tw("b", 100_000, 1)]
    plan, topo = _plan(tables, 2)
    dense = DenseSpec(13, (64, 64), (64, 1), num_features=2, dim=64)
    c0 = replace(CPU, intra_latency=5e-3, data_bag_s=0.0, data_id_s=0.0)

    def step(data_s: float, inline: bool = False, cores: int = 2):
        p = predict_step(plan, tables, dense, topo, replace(c0, data_batch_s=data_s), inline_data=inline,
                         cores=cores, threads_per_rank=1)
        assert sum(p.components_ms.values()) == pytest.approx(p.step_ms, rel=1e-12)
        return p

    none = step(1e-9)
    idle = (none.components_ms["input_dist"] + none.components_ms["output_dist"]) / 1e3
    assert idle > 10e-3 and none.rank_ms[0] == pytest.approx(none.rank_ms[1], rel=1e-12)
    hidden = step(0.5 * idle)
    assert hidden.step_ms == pytest.approx(none.step_ms, rel=1e-9) and hidden.components_ms["data"] == 0
    paid = step(idle + 20e-3)                          # 20 ms beyond the idle time
    assert paid.step_ms == pytest.approx(none.step_ms + 20.0, rel=1e-6) and paid.components_ms["data"] == 0
    assert step(0.5 * idle, inline=True).step_ms == pytest.approx(none.step_ms + 0.5 * idle * 1e3, rel=1e-9)
    assert step(idle + 20e-3, cores=4).step_ms == pytest.approx(none.step_ms, rel=1e-9)   # a core each


@pytest.mark.parametrize("cores,kind", [(4, "cpu"), (8, "cpu"), (2, "h100"), (0, "cpu")])
def test_no_turns_where_every_rank_has_a_core_or_on_accelerators(cores, kind):
    base, shared, *_ = _four_ranks_on(cores, kind)
    assert shared.step_ms == pytest.approx(base.step_ms, rel=1e-12)
    assert shared.components_ms == pytest.approx(base.components_ms, rel=1e-12)


def test_threads_count_towards_the_node_s_compute():
    _, one, *_ = _four_ranks_on(4, threads=1)
    _, two, *_ = _four_ranks_on(4, threads=2)           # 8 compute threads on 4 cores
    assert two.step_ms > one.step_ms


def test_plan_round_trip_keeps_the_prediction():
    """A plan saved and loaded predicts the same step (the footprints come from its shards)."""
    tables = [_tw("a", 300_000, 0), _tw("b", 50_000, 1)]
    plan, topo = _plan(tables, 2)
    dense = DenseSpec(13, (64, 64), (64, 1), num_features=2, dim=64)
    again = Plan.from_dict(plan.to_dict())
    assert predict_step(again, tables, dense, topo, CPU).step_ms == pytest.approx(
        predict_step(plan, tables, dense, topo, CPU).step_ms, rel=1e-12)


@pytest.mark.parametrize("kind,W,L,want", [("cpu", 2, 2, 2), ("cpu", 4, 2, 5), ("h100", 2, 2, 5)])
def test_output_collectives_of_a_mixed_plan(kind, W, L, want):
    """CPU ranks on one host carry several output distributions in one AlltoAll per direction (two
    collectives); across hosts, or on accelerators, each distribution counts: table-wise's AlltoAll
    (2: forward, backward), row-wise's ReduceScatter and AllGather (2), data-parallel's AllGather (1)."""
    from neo.planner.cost import collective_latency_split
    c = builtin_constants(kind)
    types = [ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL]
    lat_in, lat_out = collective_latency_split(types, Topology.uniform(W, L), c)
    per = c.intra_latency if W == L else c.inter_latency
    assert lat_in == pytest.approx(2 * per) and lat_out == pytest.approx(want * per)
    _, alone = collective_latency_split([ShardingType.ROW_WISE], Topology.uniform(W, L), c)
    assert alone == pytest.approx(2 * per)                   # one type: its own distribution, fused or not


def _cached(name: str, rows: int, rank: int, fraction: float) -> TableSpec:
    return TableSpec(name, rows, 32, state_floats_per_row=32, state_per_element=True, pooling_factor=1.0,
                     access_skew=1.05, cache_fraction=fraction,
                     constraints=TableConstraints((ShardingType.TABLE_WISE,), ranks=(rank,),
                                                  placement=Placement.CACHED))


def test_a_cached_tables_work_runs_beside_the_step():
    """A cached table's admission and moves (cost.cache_parts, by its formula) run on the cache's
    thread under the step before: not in ``embedding_bwd`` (the trainer measures the backward
    alone there); the step waits for them only where they outlast its path (the wait is the
    lookup's, ``embedding_fwd``); on a CPU whose ranks fill the cores they are the node's work."""
    tables = [_cached("a", 2_000_000, 0, 0.05), _cached("b", 2_000_000, 1, 0.05)]
    plan, topo = _plan(tables, 2, B=2048)
    dense = DenseSpec(13, (64, 32), (64, 1), num_features=2, dim=32)
    sh = plan.tables["a"].shards
    rows, cols = np.array([float(sh[0].rows)]), np.array([float(sh[0].cols)])
    pc = estimate_parts(tables[0], ShardingType.TABLE_WISE, rows, cols, topo, CPU, 0.05)
    c = CPU
    U, hit = pc.distinct[0], pc.hit_rate[0]
    row_b = 32 * 4 + 32 * 4
    work = c.cache_batch_s + U * c.cache_access_s + U * (1 - hit) * (2 * row_b / c.host_bw + c.cache_miss_latency)
    assert pc.miss_seconds[0] == pytest.approx(work, rel=1e-12) and work > 1e-3
    assert pc.bwd[0] > 0 and pc.compute[0] == pytest.approx(pc.fwd[0] + pc.bwd[0] + pc.miss_seconds[0])
    device = replace(plan, tables={n: replace(tp, placement=Placement.DEVICE, cache_load_factor=None)
                                   for n, tp in plan.tables.items()})
    p, d = predict_step(plan, tables, dense, topo, c), predict_step(device, tables, dense, topo, c)
    # the fused backward of the cache's slots instead of every row: cheaper, and the cache's work is not in it
    assert p.components_ms["embedding_bwd"] < d.components_ms["embedding_bwd"]
    assert p.components_ms["embedding_bwd"] < pc.bwd[0] * 1e3 + 0.5
    assert p.step_ms < d.step_ms + 1e-9 or p.components_ms["embedding_fwd"] > d.components_ms["embedding_fwd"]
    # a cache slow enough to outlast the path: the step is its work, the excess a wait in the lookup
    slow = replace(c, cache_miss_latency=200e-6)
    q = predict_step(plan, tables, dense, topo, slow)
    pq = estimate_parts(tables[0], ShardingType.TABLE_WISE, rows, cols, topo, slow, 0.05)
    assert q.step_ms == pytest.approx(pq.miss_seconds[0] * 1e3, rel=1e-9)
    assert sum(q.components_ms.values()) == pytest.approx(q.step_ms, rel=1e-12)
    assert q.components_ms["embedding_bwd"] == pytest.approx(p.components_ms["embedding_bwd"], rel=1e-9)
    # 2 ranks on 2 cores: the node's work includes both caches' threads
    on_cores = predict_step(plan, tables, dense, topo, c, cores=2, threads_per_rank=1)
    fwd_bwd = (p.components_ms["embedding_fwd"] + p.components_ms["embedding_bwd"]) / 1e3
    own = np.full(2, fwd_bwd + work + p.components_ms["dense"] / 1e3 + c.step_overhead)
    bound = cpu_bound_step(own, data_seconds(tables, 2048, c), 2, 2, 1)
    assert on_cores.step_ms == pytest.approx(max(bound * 1e3, p.step_ms), rel=1e-9)
    assert on_cores.step_ms > p.step_ms
