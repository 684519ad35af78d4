"""The planner and cached tables: the miss-ratio model against simulation, cache sizing within
memory, device placement while it fits, and the plan's cache fields."""

from __future__ import annotations

import numpy as np
import pytest

from neo.embedding.cache.index import CacheCapacityError
from neo.embedding.cache.simulate import SteadyHitRate, batch_rows, simulate, simulate_belady
from neo.planner import Placement, Plan, format_report, plan_tables
from data_pipeline.locality import zipf_ranks
from neo.planner.cache_model import CACHE_FRACTIONS, che_hit_rate, distinct_per_batch, fit_skew, hit_rate
from neo.planner.types import GIB, TableConstraints, TableSpec, Topology


def zipf_trace(rows: int, n: int, alpha: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    return rng.choice(rows, size=n, p=p / p.sum())


@pytest.mark.parametrize("alpha", [0.0, 0.9, 1.2])
def test_skew_model_matches_the_simulated_cache(alpha):
    rows, B = 50_000, 4096
    batches = batch_rows(zipf_trace(rows, B * 60, alpha), B, rows)
    measured_u = np.mean([len(b) for b in batches])
    assert distinct_per_batch(rows, alpha, B) == pytest.approx(measured_u, rel=0.05)
    # the model is the steady state of a cache of the hottest rows: above LFU (whose counts start
    # cold), below the optimum (up to the first-access misses a 60-batch trace still pays)
    k = int(0.1 * rows)
    model = hit_rate(0.1, rows, alpha, B)
    assert simulate(batches, rows, k, "lfu").hit_rate - 0.02 <= model <= simulate_belady(batches, k).hit_rate + 0.05
    model = [hit_rate(f, rows, alpha, B) for f in CACHE_FRACTIONS]
    assert model == sorted(model) and 0 < model[0] and model[-1] < 1


@pytest.mark.parametrize("alpha,n,share", [(1.05, 512, 0.05), (1.2, 2048, 0.02), (0.8, 512, 0.2)])
def test_each_policys_model_is_the_steady_state_of_its_simulated_cache(alpha, n, share):
    """Che's approximation for LRU, Che's at T + L (at most the static top share) for the
    lookahead policy, against SteadyHitRate on Zipf ids (the planner's statistics: Zipf(alpha)
    over the rows, n ids a batch). tools/check_cache_model.py runs the wider grid (docs/cache.md)."""
    rows, L = 200_000, 32
    C = int(share * rows)
    rng = np.random.default_rng(7)
    sims = {}
    for policy in ("lru", "lookahead"):
        sim = SteadyHitRate(rows, C, policy, L, counted=120)
        while not sim.done:
            sim.feed(np.unique(zipf_ranks(rng, n, rows, alpha)))
        sim.finish()
        sims[policy] = sim.hit_rate
    lru = hit_rate(share, rows, alpha, n, policy="lru")
    ahead = hit_rate(share, rows, alpha, n, policy="lookahead", lookahead=L)
    top = hit_rate(share, rows, alpha, n, policy="lfu")
    assert lru == pytest.approx(sims["lru"], abs=0.025)
    assert ahead == pytest.approx(sims["lookahead"], abs=0.035)
    assert top >= ahead >= lru and ahead > lru + 0.01                    # the window keeps rows LRU loses
    assert hit_rate(share, rows, alpha, n, policy="lookahead", lookahead=0) == pytest.approx(lru)


def test_the_window_cannot_hold_more_rows_than_the_cache():
    """A window of 32 batches that reads far more rows than the cache holds: the lookahead
    model is the static top share there, not Che's at T + 32."""
    rows, n, share = 2_000_000, 16_384, 0.01
    assert che_hit_rate(rows, 1.05, n, share * rows, 32) > hit_rate(share, rows, 1.05, n, policy="lfu") + 0.1
    assert hit_rate(share, rows, 1.05, n, policy="lookahead", lookahead=32) == hit_rate(share, rows, 1.05, n)
    with pytest.raises(ValueError, match="cache policy must be one of"):
        hit_rate(share, rows, 1.05, n, policy="fifo")
    with pytest.raises(Exception, match="table 't': cache_policy must be one of lfu, lru, lookahead"):
        TableSpec("t", 10, 4, cache_policy="fifo")
    from neo.config.embedding import TableConfig
    from neo.config.tables import table_spec

    spec = table_spec(TableConfig("t", 100, 4, placement="cached", cache_policy="lru", cache_lookahead=7))
    assert (spec.cache_policy, spec.cache_lookahead) == ("lru", 7)            # the config's policy reaches the model


def test_measured_curve_is_interpolated():
    curve = ((0.05, 0.4), (0.2, 0.7))
    assert hit_rate(0.05, 1000, 0.0, 10, curve) == pytest.approx(0.4)
    assert 0.4 < hit_rate(0.1, 1000, 0.0, 10, curve) < 0.7
    assert hit_rate(0.5, 1000, 0.0, 10, curve) == pytest.approx(0.7)
    assert hit_rate(1.0, 1000, 0.0, 10, curve) == 1.0


def first_warm(masks, capacity, turnovers=2.0):
    """Index of the first batch admitted with the misses before it at ``turnovers`` x capacity
    or more (``masks``: each batch's hits, from simulate()), None if none."""
    misses = np.cumsum([0] + [int((~m).sum()) for m in masks])
    return next((i for i in range(len(masks)) if misses[i] >= turnovers * capacity), None)


def warm_window(batches, rows, capacity, policy, lookahead, counted, turnovers=2.0):
    """The oracle of SteadyHitRate: simulate() over every batch, its per-batch hits, and the hit
    rate of the ``counted`` batches from :func:`first_warm` on; None if the trace ends first."""
    masks = []
    simulate(batches, rows, capacity, policy, lookahead, pipelined=True, hit_masks=masks)
    warm = first_warm(masks, capacity, turnovers)
    if warm is None or warm + counted > len(batches):
        return None
    window = masks[warm:warm + counted]
    return sum(int(m.sum()) for m in window) / sum(len(m) for m in window)


@pytest.mark.parametrize("policy, lookahead", [("lru", 0), ("lfu", 0), ("lookahead", 4)])
def test_steady_hit_rate_counts_the_batches_after_two_turnovers(policy, lookahead):
    rows, B, counted = 20_000, 1024, 10
    batches = batch_rows(zipf_trace(rows, B * 120, 1.05, seed=3), B, rows)
    for capacity in (2_000, 5_000):
        sim = SteadyHitRate(rows, capacity, policy, lookahead, counted)
        projected = None                         # batches to warm up, projected after 5 admitted
        for b in batches:
            sim.feed(b)
            if sim.admitted == 5 and projected is None:
                projected = sim.batches_to_warm()
            if sim.done:
                break
        sim.finish()
        expected = warm_window(batches, rows, capacity, policy, lookahead, counted)
        assert expected is not None and sim.done and sim.batches == counted
        assert sim.hit_rate == expected          # the same cache index, batch for batch
        # the projection at the rate of the first misses does not overstate what warming up took
        masks = []
        simulate(batches, rows, capacity, policy, lookahead, pipelined=True, hit_masks=masks)
        assert 0 < projected <= first_warm(masks, capacity) - 5
        # the first batches from an empty cache hit less: what the planner measured before
        cold = simulate(batches[:counted], rows, capacity, policy, lookahead, pipelined=True).hit_rate
        assert cold < sim.hit_rate


def test_steady_hit_rate_cold_and_too_small():
    rows, B = 20_000, 1024
    batches = batch_rows(zipf_trace(rows, B * 6, 1.05, seed=4), B, rows)
    sim = SteadyHitRate(rows, 8_000, "lru", 0, counted=4)
    for b in batches:
        sim.feed(b)
    sim.finish()
    assert not sim.warm and not sim.done and sim.hit_rate is None      # six batches cannot fill 8,000 slots
    small = SteadyHitRate(rows, len(batches[0]) + 10, "lru", 0, counted=4)
    with pytest.raises(CacheCapacityError):
        for b in batches:
            small.feed(b)
    with pytest.raises(ValueError, match="counted"):
        SteadyHitRate(rows, 100, "lru", 0, counted=0)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.05, 1.4])
def test_fit_skew_inverts_the_distinct_rows_model(alpha):
    rows, n = 2_000_000, 4096
    assert fit_skew(rows, n, distinct_per_batch(rows, alpha, n)) == pytest.approx(alpha, abs=1e-6)


def test_fit_skew_of_a_zipf_trace_and_its_edges():
    rows, B = 200_000, 4096
    batches = batch_rows(zipf_trace(rows, B * 16, 1.05, seed=5), B, rows)
    assert fit_skew(rows, B, np.mean([len(b) for b in batches])) == pytest.approx(1.05, abs=0.05)
    assert fit_skew(rows, B, B) == 0.0                  # no repeats: as uniform as the model goes
    assert fit_skew(rows, B, 1.0) == 4.0                # one row: the exponent's cap
    assert fit_skew(0, B, 1.0) == 0.0 and fit_skew(rows, 0, 0.0) == 0.0


def _tables(placement, n=6, rows=4_000_000):
    return [TableSpec(f"t{k}", rows, 64, state_floats_per_row=1, pooling_factor=4, access_skew=1.05,
                      constraints=TableConstraints(placement=placement)) for k in range(n)]


def test_auto_tables_stay_on_the_device_while_they_fit():
    plan = plan_tables(_tables(Placement.AUTO), Topology.uniform(2, 2, hbm_gib=8))
    assert {tp.placement for tp in plan.tables.values()} == {Placement.DEVICE}


def test_auto_tables_are_cached_when_device_memory_runs_short():
    tables = _tables(Placement.AUTO)                      # 6 x 4M x 64 x (4 B + state): ~6.2 GiB
    topo = Topology.uniform(2, 2, hbm_gib=2)
    plan = plan_tables(tables, topo)
    cached = [tp for tp in plan.tables.values() if tp.placement is Placement.CACHED]
    assert cached, "nothing was cached although the tables need 3x the device memory"
    assert all(r.memory_bytes <= 2 * GIB for r in plan.ranks)
    for tp in cached:
        assert tp.cache_load_factor in CACHE_FRACTIONS and 0 < tp.expected_hit_rate < 1 and tp.miss_ms > 0
        assert tp.cache_rows == sum(int(np.ceil(tp.cache_load_factor * s.rows)) for s in tp.shards)
    assert "Cached tables" in format_report(plan)
    again = Plan.from_json(plan.to_json())
    assert again.tables == plan.tables


def test_a_fixed_cache_size_is_kept():
    t = TableSpec("t", 1_000_000, 32, constraints=TableConstraints(placement=Placement.CACHED), cache_fraction=0.2,
                  access_skew=1.1)
    tp = plan_tables([t], Topology.uniform(1, 1)).tables["t"]
    assert tp.placement is Placement.CACHED and tp.cache_load_factor == 0.2 and tp.cache_rows == 200_000


@pytest.mark.parametrize("kind", ["data_parallel", "row_wise", "table_wise", "column_wise"])
def test_cache_rows_are_the_tables_not_the_sum_of_its_replicas(kind):
    """A cached table's cache_rows: its shards' together (row-wise), one replica's (data-parallel:
    each replica caches the whole table), never more than the table's rows (the plan of a
    data-parallel table said 2x its rows at 2 ranks: audit of 2026-11-30)."""
    t = TableSpec("t", 100_000, 64, constraints=TableConstraints(placement=Placement.CACHED, sharding_types=(kind,)),
                  cache_fraction=0.5)
    tp = plan_tables([t], Topology.uniform(2, 2)).tables["t"]
    assert tp.sharding_type.value == kind and tp.cache_rows == 50_000, (kind, tp.cache_rows)


def test_more_skew_means_a_higher_expected_hit_rate():
    hits = []
    for alpha in (0.6, 1.2):
        t = TableSpec("t", 2_000_000, 32, constraints=TableConstraints(placement=Placement.CACHED),
                      cache_fraction=0.05, access_skew=alpha)
        hits.append(plan_tables([t], Topology.uniform(1, 1)).tables["t"].expected_hit_rate)
    assert hits[0] < hits[1]


def test_a_cache_too_small_for_two_batches_is_never_planned():
    # 100k rows, 512 x 8 ids per rank per step, uniform: ~4k distinct rows per batch at 1 rank
    t = TableSpec("t", 100_000, 16, pooling_factor=8, constraints=TableConstraints(placement=Placement.CACHED))
    tp = plan_tables([t], Topology.uniform(1, 1)).tables["t"]
    assert tp.cache_rows >= 2 * distinct_per_batch(100_000, 0.0, 512 * 8)
