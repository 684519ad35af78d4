"""End-to-end planner tests: invariants, constraints, memory, heterogeneity, hierarchy."""

import json
from dataclasses import replace
from typing import Tuple

import numpy as np
import pytest

from neo.planner import (GIB, CostConstants, Device, Plan, PlanningError, ShardingType, Topology, check_shards_tile,
                         format_report, plan_tables)
from neo.planner.types import Placement, TableConstraints, TableSpec
from neo.planner.workloads import production_like_tables


def assert_invariants(plan: Plan, tables, topo: Topology):
    assert plan.world_size == topo.world_size and plan.local_world_size == topo.local_world_size
    assert set(plan.tables) == {t.name for t in tables}, "every table covered exactly once"
    for t in tables:
        tp = plan.tables[t.name]
        check_shards_tile(t, tp.sharding_type, tp.shards, topo.world_size)
        if tp.sharding_type is ShardingType.ROW_WISE:
            assert sorted(s.rank for s in tp.shards) == list(range(topo.world_size))
            sizes = [s.rows for s in tp.shards]
            assert max(sizes) - min(sizes) <= 1
        if tp.sharding_type in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE):
            assert len({topo.node_of(s.rank) for s in tp.shards}) == 1, "one node"
        if tp.sharding_type is ShardingType.TABLE_ROW_WISE:
            assert len({s.rank for s in tp.shards}) == topo.local_world_size
    assert [r.rank for r in plan.ranks] == list(range(topo.world_size))
    for r, d in zip(plan.ranks, topo.devices):
        assert r.memory_bytes <= d.hbm_bytes
        assert r.host_memory_bytes <= d.host_bytes
        assert r.predicted_ms > 0


def test_production_like_invariants_and_json_round_trip(make_tables):
    tables = make_tables(120, seed=3)
    topo = Topology.uniform(16, 8, hbm_gib=80)
    plan = plan_tables(tables, topo)
    assert_invariants(plan, tables, topo)
    back = Plan.from_json(plan.to_json())
    assert back == plan
    d = json.loads(plan.to_json())
    assert set(d) >= {"world_size", "local_world_size", "tables", "ranks"}
    some = next(iter(d["tables"].values()))
    assert set(some["shards"][0]) == {"rank", "row_offset", "rows", "col_offset", "cols"}
    assert set(d["ranks"][0]) >= {"rank", "memory_bytes", "predicted_ms"}
    assert plan.imbalance <= 1.05
    text = format_report(plan)
    assert "imbalance" in text and "t0" in text


@pytest.mark.parametrize("st", list(ShardingType))
def test_each_sharding_type_honoured(st, make_table):
    tables = [make_table("forced", 10_000, 64, types=[st], pf=5)] + [make_table(f"o{i}", 1000 * (i + 1), 32)
                                                                     for i in range(6)]
    topo = Topology.uniform(8, 4, hbm_gib=8)
    plan = plan_tables(tables, topo)
    assert plan.tables["forced"].sharding_type is st
    assert_invariants(plan, tables, topo)
    shards = plan.tables["forced"].shards
    if st is ShardingType.DATA_PARALLEL:
        assert len(shards) == 8
    if st is ShardingType.TABLE_WISE:
        assert len(shards) == 1
    if st is ShardingType.ROW_WISE:
        assert len(shards) == 8 and all(s.cols == 64 for s in shards)


def test_column_shard_width_and_pinned_ranks(make_table):
    tables = [make_table("cw", 5000, 128, types=["column_wise"], width=32),
              make_table("pin", 5000, 64, ranks=[5]), make_table("pin2", 5000, 64, types=["column_wise"],
                                                                  ranks=[2, 3], width=32)]
    tables = [TableSpec(t.name, t.rows, t.dim, constraints=TableConstraints(
        tuple(ShardingType(s) for s in t.constraints.sharding_types), t.constraints.ranks,
        t.constraints.column_shard_width)) for t in tables]
    topo = Topology.uniform(8, 4, hbm_gib=4)
    plan = plan_tables(tables, topo)
    assert [s.cols for s in plan.tables["cw"].shards] == [32, 32, 32, 32]
    assert all(s.rank == 5 for s in plan.tables["pin"].shards)
    assert plan.tables["pin"].sharding_type in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)
    assert {s.rank for s in plan.tables["pin2"].shards} <= {2, 3}
    assert_invariants(plan, tables, topo)


def test_pinned_ranks_with_incompatible_type_is_an_error(make_table):
    t = TableSpec("bad", 100, 16, constraints=TableConstraints((ShardingType.ROW_WISE,), (1,)))
    with pytest.raises(PlanningError, match=r"'bad'.*pinned ranks \[1\].*table_wise"):
        plan_tables([t], Topology.uniform(2, 2))


def test_huge_table_is_split_because_it_does_not_fit_one_device(make_table):
    big = make_table("huge", 100_000_000, 128)  # 100M x 128 x 4 B = 47.7 GiB + state
    topo = Topology.uniform(8, 4, hbm_gib=16)
    plan = plan_tables([big, make_table("small", 1000, 16)], topo)
    assert plan.tables["huge"].sharding_type not in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL)
    assert len(plan.tables["huge"].shards) > 1
    assert_invariants(plan, [big, make_table("small", 1000, 16)], topo)


def test_memory_error_names_table_and_missing_bytes(make_table):
    big = make_table("giant", 100_000_000, 128, types=["table_wise"])
    with pytest.raises(PlanningError) as e:
        plan_tables([big], Topology.uniform(4, 4, hbm_gib=16))
    msg = str(e.value)
    assert "'giant'" in msg and "GiB" in msg and "missing" in msg and "table_wise" in msg
    # what is missing: needed - 16 GiB
    need = 100_000_000 * (128 * 4 + 4)
    assert f"{(need - 16 * GIB) / GIB:.2f} GiB" in msg or "missing" in msg


def test_total_memory_too_small_names_tables_and_missing_bytes(make_table):
    tables = [make_table(f"m{i}", 20_000_000, 64) for i in range(6)]  # ~4.8 GiB each
    with pytest.raises(PlanningError, match=r"need at least \d+ bytes \(\d+\.\d\d GiB\).*GiB\) missing; "
                                            r"largest tables: 'm\d'"):
        plan_tables(tables, Topology.uniform(2, 2, hbm_gib=10))


def test_packing_failure_names_a_table(make_table):
    # 3 table-wise-only tables of ~5.6 GiB on 2 ranks of 10 GiB: the total fits, no packing does
    tables = [make_table(f"p{i}", 23_000_000, 64, types=["table_wise"]) for i in range(3)]
    with pytest.raises(PlanningError, match=r"table 'p\d'.*no rank has room.*GiB\) missing"):
        plan_tables(tables, Topology.uniform(2, 2, hbm_gib=10))


def test_heterogeneous_speeds_shift_load(make_tables):
    tables = make_tables(80, seed=5, max_rows=1e6)
    devs = tuple(Device(80 * GIB, 256 * GIB, 0.25 if r == 0 else 1.0) for r in range(4))
    plan = plan_tables(tables, Topology(4, 4, devs))
    assert plan.imbalance < 1.1, "times stay balanced"
    fast = np.mean([r.compute_ms for r in plan.ranks[1:]])
    # lookup work on a rank = its compute time x its speed: the 4x slower rank gets far less
    assert plan.ranks[0].compute_ms * 0.25 < 0.6 * fast
    assert plan.ranks[0].compute_ms <= 1.5 * fast
    uniform = plan_tables(tables, Topology.uniform(4, 4))
    assert uniform.max_ms <= plan.max_ms


def test_hierarchical_table_row_wise_stays_in_one_node(make_table):
    tables = [make_table(f"twrw{i}", 1_000_000, 64, types=["table_row_wise"], pf=20) for i in range(4)]
    tables += [make_table(f"tw{i}", 100_000, 32, pf=2) for i in range(10)]
    topo = Topology.uniform(16, 4)
    plan = plan_tables(tables, topo)
    nodes = set()
    for i in range(4):
        tp = plan.tables[f"twrw{i}"]
        assert tp.sharding_type is ShardingType.TABLE_ROW_WISE
        node = {topo.node_of(s.rank) for s in tp.shards}
        assert len(node) == 1 and sorted(s.rank % 4 for s in tp.shards) == [0, 1, 2, 3]
        nodes |= node
    assert len(nodes) == 4, "the 4 groups are spread over the 4 nodes"
    assert_invariants(plan, tables, topo)


def test_cached_placement_keeps_every_row_in_host_memory(make_table):
    t = TableSpec("uvm", 10_000_000, 64, constraints=TableConstraints(placement=Placement.CACHED), access_skew=1.1)
    plan = plan_tables([t], Topology.uniform(2, 2, hbm_gib=1))
    assert sum(r.host_memory_bytes for r in plan.ranks) >= 10_000_000 * 64 * 4
    tp = plan.tables["uvm"]
    assert tp.placement is Placement.CACHED and 0 < tp.cache_load_factor < 1
    assert sum(r.memory_bytes for r in plan.ranks) < 2 * 2**30


def test_cost_constants_from_json(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"inter_bw": 50e9, "update_id_s": 3e-9}))
    c = CostConstants.from_json(str(p))
    assert c.inter_bw == 50e9 and c.update_id_s == 3e-9 and c.lookup_bw_cold == CostConstants().lookup_bw_cold
    p.write_text(json.dumps({"nope": 1}))
    with pytest.raises(PlanningError, match="nope"):
        CostConstants.from_json(str(p))
    for name, value in (("intra_bw", 0), ("lookup_id_s", -1e-9), ("dense_flops", 0.0)):
        with pytest.raises(PlanningError, match=f"cost constant {name}: must be > 0"):
            CostConstants(**{name: value})


def test_data_parallel_is_chosen_only_where_the_model_says_it_is_cheaper(make_table):
    """Neo's data-parallel replicas receive every rank's ids and apply the global batch's update:
    the planner weighs that against the AlltoAlls, and its choice is never worse than forcing it."""
    topo = Topology.uniform(8, 4)
    t = [make_table("tiny", 100, 16, pf=50), make_table("x", 10000, 64)]
    free = plan_tables(t, topo)
    forced = plan_tables([make_table("tiny", 100, 16, pf=50, types=[ShardingType.DATA_PARALLEL]), t[1]], topo)
    assert forced.tables["tiny"].sharding_type is ShardingType.DATA_PARALLEL
    assert free.summary["objective_ms"] <= forced.summary["objective_ms"] + 1e-9
    assert free.tables["x"].sharding_type is not ShardingType.DATA_PARALLEL


def test_inputs_not_mutated(make_tables):
    tables = make_tables(20, seed=1)
    before = list(tables)
    topo = Topology.uniform(4, 2)
    p1 = plan_tables(tables, topo)
    p2 = plan_tables(tables, topo)
    assert tables == before and p1 == p2, "deterministic, inputs untouched"


def test_evaluate_plan_reproduces_the_planners_numbers(make_tables):
    from neo.planner import evaluate_plan

    tables = make_tables(60, seed=11)
    topo = Topology.uniform(8, 4)
    plan = plan_tables(tables, topo)
    again = evaluate_plan(tables, topo, plan.tables)
    for a, b in zip(plan.ranks, again.ranks):
        assert a.memory_bytes == pytest.approx(b.memory_bytes, rel=1e-9, abs=2)
        assert a.predicted_ms == pytest.approx(b.predicted_ms, rel=1e-9)


@pytest.mark.parametrize("st", list(ShardingType))
def test_plans_pass_the_runtimes_plan_view(st):
    """Integration: the runtime's validator (neo.distributed.plan_view, another module) accepts the plans."""
    from neo.distributed import plan_view
    from neo.config import config_from_dict

    tables = [{"name": "forced", "num_rows": 1003, "dim": 64, "sharding_types": [st.value], "pooling_factor": 5},
              {"name": "a", "num_rows": 5000, "dim": 32}, {"name": "b", "num_rows": 7, "dim": 16},
              {"name": "c", "num_rows": 200000, "dim": 128, "pooling_factor": 20}]
    cfg = config_from_dict({"tables": tables, "topology": {"world_size": 8, "local_world_size": 4, "hbm_gib": 2}})
    plan = plan_tables(cfg.table_specs(), cfg.topology.to_topology(), cfg.cost_constants(8)[0])
    view = plan_view.PlanView.from_plan(plan.to_json(), cfg.table_configs())
    assert view.tables["forced"].sharding_type.value == st.value


# A 2-core CPU's calibration (neo calibrate, 2 ranks x 1 thread, AMD EPYC): under it the main
# job's 50-row table once looked data-parallel to the per-table choice, one more collective a step.
EPYC_2CORE = CostConstants(device_kind="cpu", lookup_id_s=1.7e-9, lookup_bw_hot=7.3e10, lookup_bw_cold=3.7e10,
                           update_id_s=1.2e-8, update_row_s=2.7e-8, update_bw_cold=2.1e10, lookup_call_s=3.7e-4,
                           intra_bw=3.9e9, intra_latency=3.9e-5, hot_bytes=2**20, cold_bytes=2**27,
                           update_bw_hot=1e13, lookup_bag_s=1e-12, kernel_overhead=5e-6, allreduce_latency=1.4e-3,
                           allreduce_bw=1.5e9)


@pytest.mark.parametrize("W,n,max_rows,seed", [(4, 8, 1e8, 0), (8, 20, 1e6, 0)])
def test_a_planner_restricted_to_fewer_kinds_is_seldom_and_little_faster(W, n, max_rows, seed, make_tables):
    """The pick is ranked by the step model's embedding part (the busiest rank). Its rivals: every
    table forced to one sharding type, or one kind the pick uses forbidden (per-kind collective
    latency is invisible to per-table choices: the variants without a kind and the uniform plans
    are proposed for it). The planner is a heuristic, and the rivals search too: over 30 workloads
    of three families (W 4 n 8, W 8 n 20 and n 40; 791 comparisons, 2026-12-02) a rival predicted a
    less busy busiest rank in 4, by 0.7-2.2% (before the pick was ranked by the plan's own numbers
    and near proposals' variants were tried: 4, by up to 10.3%; with six variant bases instead of
    twelve, at seed shift 487: one by 6.2%, three kind-dropping variants short of it). Here, under
    EPYC_2CORE, the six workloads from ``seed`` that fit and every rival that can be planned: none
    more than 2.5% faster, more than 0.1% faster in at most one workload, and most of them other
    plans than the pick. Not every draw holds it: over seeds 400-599 of both families (2026-12-07,
    the best's kind-dropping proposals at every cap since; docs/planner.md) a rival was faster by
    more than 0.1% in 6 of 1,696 comparisons, by 5.2% at seed 458 (seed shifts 453-458 fail here),
    and before that change in 11, by up to 11.1% (shift 559 failed, by 5.1% at seed 564)."""
    c = EPYC_2CORE
    topo = replace(Topology.uniform(W, W, hbm_gib=8), batch_size_per_rank=1024)
    ratios, other_plans, workloads = [], 0, 0
    for s in range(seed, seed + 6):
        tables = make_tables(n, seed=s, max_rows=max_rows)
        try:
            free = plan_tables(tables, topo, c)
        except PlanningError:                 # a table larger than the cluster allows it
            continue
        workloads += 1
        used = {tp.sharding_type for tp in free.tables.values()}
        rivals = {st.value: [st] for st in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE)}
        rivals.update({f"without {k.value}": [st for st in ShardingType if st is not k] for k in used})
        for name, types in rivals.items():
            forced = [replace(t, constraints=TableConstraints(tuple(types))) for t in tables]
            try:
                other = plan_tables(forced, topo, c)
            except PlanningError:             # e.g. a table too large for one rank, forced table-wise
                continue
            other_plans += other.tables != free.tables
            ratios.append((free.summary["max_ms"] / other.summary["max_ms"], s, name))
    assert workloads >= 4 and other_plans >= 12, (workloads, other_plans)
    assert max(ratios)[0] <= 1.025, max(ratios)
    assert len({s for r, s, _ in ratios if r > 1.001}) <= 1, sorted(ratios)[-3:]


@pytest.mark.parametrize("W,n,max_rows,workload,rival", [(8, 20, 1e6, 0, ShardingType.ROW_WISE),
                                                          (4, 8, 1e8, 15, ShardingType.TABLE_WISE),
                                                          (8, 20, 1e6, 7, ShardingType.ROW_WISE)])
def test_the_variants_find_what_a_planner_without_a_kind_finds(W, n, max_rows, workload, rival):
    """Workloads where the pick depends on the variants (a proposal without a kind, tried for the
    best candidate and for proposals whose bound is near it): without any variants the planner
    predicted a busiest rank 0.17% and 6.3% slower than the planner forbidden ``rival`` on the first
    two, and with the best candidate's variants only, 4.5% slower on the third (its best used one
    kind: no variant without a kind; 2026-12-02). The workloads are fixed (drawn from a generator of
    their own, whatever ``--seed-shift``), the planner's own kicks not."""
    c = EPYC_2CORE
    topo = replace(Topology.uniform(W, W, hbm_gib=8), batch_size_per_rank=1024)
    tables = production_like_tables(n, max_rows=max_rows, rng=np.random.Generator(np.random.PCG64(workload)))
    free = plan_tables(tables, topo, c)
    forced = [replace(t, constraints=TableConstraints(tuple(st for st in ShardingType if st is not rival)))
              for t in tables]
    other = plan_tables(forced, topo, c)
    assert free.summary["max_ms"] <= other.summary["max_ms"] * 1.001 + 1e-9, (free.summary, other.summary)


def test_small_tables_pick_is_never_slower_than_all_row_or_all_column_wise(make_table):
    """The main job's case (eight small tables, 2 ranks, EPYC_2CORE): its 50-row
    table once looked data-parallel to the per-table choice; the pick (all table-wise today)
    predicts a busiest rank no busier than the row-wise or column-wise plan of every table."""
    c = EPYC_2CORE
    tables = [make_table(f"t{k}", r, 16) for k, r in enumerate([50, 200, 1000, 1000, 1000, 1500, 3000, 4000])]
    topo = replace(Topology.uniform(2, 2, hbm_gib=8), batch_size_per_rank=1024)
    free = plan_tables(tables, topo, c)
    assert ShardingType.DATA_PARALLEL not in {tp.sharding_type for tp in free.tables.values()}
    for st in (ShardingType.ROW_WISE, ShardingType.COLUMN_WISE):
        forced = [replace(t, constraints=TableConstraints((st,))) for t in tables]
        other = plan_tables(forced, topo, c)
        assert other.tables != free.tables, st
        assert free.summary["max_ms"] <= other.summary["max_ms"] * 1.001 + 1e-9, st


def _search_best(plan: Plan) -> Tuple[float, str, str]:
    """The feasible candidate the search ranks first: least busiest rank by the search's own
    costs (the candidates' ``max_ms``), the earliest on a tie."""
    done = [c for c in plan.summary["candidates"] if c["partitioner"] != "bound" and c["feasible"]]
    best = min(done, key=lambda c: c["max_ms"])            # min keeps the first of equals
    return best["max_ms"], best["proposal"], best["partitioner"]


@pytest.mark.parametrize("W,L,n,max_rows,seed", [(8, 8, 20, 1e6, 0), (16, 8, 60, 1e8, 1)])
def test_proposals_skipped_by_their_bound_never_hold_the_searchs_best(W, L, n, max_rows, seed, make_tables):
    """A proposal whose lower bound (neo.planner.partition.lower_bound) already ranks below the
    best so far is not partitioned. With ``alternatives`` every proposal is partitioned: the
    search's best candidate must be the same one, each skipped proposal's bound must lie above
    it (the reason for the skip) and at or below every partition of that proposal (a bound).

    The pick itself may differ: the plans are ranked again at their ranks' own footprints,
    which the search's bounds do not bound, so a skipped proposal can win there (seeds 240-299
    of these two settings: the pick differed at one seed of each, its busiest rank 3.7% and 0%
    above the exhaustive pick's; ``tools/bench_planner.py --skip-seeds``, docs/planner.md, "pick")."""
    tables = make_tables(n, seed=seed, max_rows=max_rows)
    topo = Topology.uniform(W, L, hbm_gib=24)
    fast = plan_tables(tables, topo)
    every = plan_tables(tables, topo, alternatives=1)
    best = _search_best(fast)
    assert best == _search_best(every)
    skipped = [c for c in fast.summary["candidates"] if c["partitioner"] == "bound"]
    assert skipped, "no proposal skipped: the case tests nothing"
    assert not [c for c in every.summary["candidates"] if c["partitioner"] == "bound"]
    for c in skipped:
        assert c["max_ms"] > best[0], c
        done = [x["max_ms"] for x in every.summary["candidates"] if x["proposal"] == c["proposal"]]
        assert done and min(done) >= c["max_ms"] * (1 - 1e-9), (c, done)
    kept = {(c["proposal"], c["partitioner"]) for c in fast.summary["candidates"] if c["feasible"]}
    assert (fast.summary["proposal"], fast.summary["partitioner"]) in kept
    assert "not partitioned" in format_report(fast)
