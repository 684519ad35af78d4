"""The staged planner: enumerate -> estimate -> propose -> partition -> pick -> plan.

Each stage is a function returning new objects. :func:`plan_tables` is the entry point.

Proposals choose one option per table. Proposal ``theta`` takes, for each table, the option
of least total work (sum of its parts' times over the cluster) among those whose largest
part is at most ``theta`` x the ideal per-rank load (total work / W), else the option with
the smallest largest part: small tables stay whole (or data-parallel when replicas are
cheaper than the ids/pooled AlltoAlls), heavy ones are split column/row-wise so that no
single shard dominates a rank (the Neo paper's hierarchical mix). A memory-aware variant
also caps each part at a fraction of the device memory. When the chosen options need more
memory than the cluster has, tables move to their next option with less memory (a smaller
cache, or a cache instead of every row on the device) in the order of the least time added
per byte saved, until they fit. Every proposal is partitioned by greedy, Karmarkar-Karp and
the refinement, unless its lower bound (:func:`neo.planner.partition.lower_bound`) already
ranks below the best candidate so far. Then come the variants of the best so far (:func:`variants`: the plan without
one of its collective kinds, and the uniform plans), which per-table choices cannot reach; for the
best, the proposals without each of its kinds are made at every cap, as the planner makes them
when the config forbids that kind. The
feasible result whose busiest rank is least busy wins (the step model's embedding part; within
0.1%, the lower objective max + imbalance_weight x (max - mean) predicted rank time).

Tables with ``placement: auto`` are first planned on the device only; their cached options
(:mod:`neo.planner.cache_model`) enter only when that plan does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from neo.planner.cost import collective_latency, estimate_joined, estimate_many, input_side_cost
from neo.planner.enumerate import Option, enumerate_options
from neo.planner.memory_fit import _check_total_memory, _fit_total_memory
from neo.planner.partition import Assignment, lower_bound, objective
from neo.planner.partition_step import _input_side, _run_partitioners, build_problem
from neo.planner.plan import Plan, RankStats, TablePlan
from neo.planner.step_model import rank_footprints
from neo.planner.constants import CostConstants
from neo.planner.types import (GIB, Placement, PlanningError, Shard, ShardingType, TableSpec,
                               Topology)

__all__ = ["plan_tables", "evaluate_plan", "propose", "build_problem", "PARTITIONERS"]

PARTITIONERS = ("greedy", "karmarkar_karp", "refine")
_THETAS = (float("inf"), 1.0, 0.25, 0.05)

_RECOST_MAX = 12
"""Feasible candidates, at most this many distinct plans in the search's order, are costed again
at their ranks' own footprints and ranked by those. The search costs every option at an even
share of the bytes a rank holds; the gap can be large (1,000 tables on 128 ranks, the built-in
CPU constants: a candidate at 806 ms by the search's costs is 578 ms by its own, the best)."""

_VARIANT_STEPS = 50
"""Besides the best candidate's, the variants of proposals whose lower bound is within this many
0.1% steps (5%) of the best are tried: a proposal that loses may lose by one kind a few of its
tables took, which its variant without that kind drops (at most ``_VARIANT_BASES`` bases in all).
A variant is a base too, so kinds leave one per level: with 6 bases one workload (8 tables on 4
ranks, the test suite's seeds shifted by 487) kept a column- and row-wise plan 6.2% slower than the
all-but-one table-wise plan three levels down, which the same search with row-wise forbidden
reached; with 12 that and 515 other comparisons against restricted searches showed none faster (a
1,000-table plan on 128 ranks no slower: 2.09-2.55 s against 2.02-2.37, 2026-12-07). The best's
own kind-dropping proposals come at every cap (:func:`variants`, ``all_caps``; docs/planner.md)."""
_VARIANT_BASES = 12


@dataclass(frozen=True)
class Proposal:
    name: str
    choice: Tuple[int, ...]
    """Index into each table's option list."""
    theta: Optional[float] = None
    """The largest part's cap (x the ideal per-rank load) that chose it; None for a variant."""
    mem_frac: Optional[float] = None
    """The cap on each part's memory (x the smallest device's) that chose it; None for a variant."""


def _work_and_memory(tables: Sequence[TableSpec], options: Sequence[Sequence[Option]], topo: Topology,
                     c: CostConstants):
    """(work each option adds to the cluster: its parts plus the input side every rank pays, 0
    for DP; device memory of each option; the cluster's memory left for embeddings)."""
    W = topo.world_size
    side = {}                                   # a table's input side depends on its sharding type only

    def input_side(o: Option) -> float:
        key = (o.table, o.sharding_type)
        if key not in side:
            side[key] = input_side_cost(tables[o.table], o.sharding_type, topo, c)[0]
        return side[key]

    totals = [np.array([o.total_seconds + W * input_side(o) for o in opts]) for opts in options]
    sumhbm = [np.array([float(o.costs.hbm.sum()) for o in opts]) for opts in options]
    total_cap = sum(d.hbm_bytes for d in topo.devices) * (1 - c.memory_headroom)
    return totals, sumhbm, total_cap - _input_side(tables, [opts[0] for opts in options], topo, c)[3] * W


def propose(tables: Sequence[TableSpec], options: Sequence[Sequence[Option]], topo: Topology,
            c: CostConstants, without: Optional[ShardingType] = None,
            caps: Optional[Sequence[Tuple[float, float]]] = None, work=None) -> List[Proposal]:
    """Candidate option choices (deduplicated), see the module docstring. ``without``: no table
    takes an option of that sharding type (none when a table has no other); ``caps``: the
    (mem_frac, theta) pairs to run, by default every one; ``work``: :func:`_work_and_memory`'s
    result when the caller has it."""
    W = topo.world_size
    totals, sumhbm, embed_cap = work or _work_and_memory(tables, options, topo, c)
    # the tables' options side by side, one row a table (padded with inf: never chosen)
    T = _padded(totals)
    if without is not None:
        T = np.where(_type_codes(options) == _CODE[without], np.inf, T)
        if not np.isfinite(T).any(axis=1).all():
            return []
        totals = [T[k, :len(t)] for k, t in enumerate(totals)]
    MP = np.where(np.isfinite(T), _padded([[o.max_part_seconds for o in opts] for opts in options]), np.inf)
    MH = np.where(np.isfinite(T), _padded([[o.max_part_hbm for o in opts] for opts in options]), np.inf)
    min_cap = min(d.hbm_bytes for d in topo.devices) * (1 - c.memory_headroom)
    total_cap = sum(d.hbm_bytes for d in topo.devices) * (1 - c.memory_headroom)
    out: List[Proposal] = []
    seen = set()
    prefix = "" if without is None else f"without {without.value}: "
    rows = np.arange(len(totals))
    for mem_frac, theta in caps if caps is not None else [(m, t) for m in (1.0, 0.5) for t in _THETAS]:
        choice = np.argmin(T, axis=1)
        for _ in range(2):
            target = sum(T[rows, choice].tolist()) / W
            room = MH <= mem_frac * min_cap
            ok = (MP <= theta * target) & room
            new = np.where(ok.any(axis=1), np.argmin(np.where(ok, T, np.inf), axis=1),
                           np.where(room.any(axis=1), np.argmin(np.where(room, MP, np.inf), axis=1),
                                    np.argmin(MH, axis=1)))
            if np.array_equal(new, choice):
                break
            choice = new
        choice = choice.tolist()
        for slack in (1.0, 0.9, 0.75):
            fitted = _fit_total_memory(choice, totals, sumhbm, embed_cap - (1 - slack) * total_cap)
            key = tuple(fitted)
            if key not in seen:
                seen.add(key)
                out.append(Proposal(f"{prefix}theta={theta:g},mem={mem_frac:g}" + (f",fit={slack:g}" if fitted != choice
                                                                                   else ""), key, theta, mem_frac))
            if fitted == choice:
                break
    return out


def _padded(per_table, fill: float = np.inf) -> np.ndarray:
    """(tables, most options) array of per-option values, ``fill`` past a table's options."""
    out = np.full((len(per_table), max(len(v) for v in per_table)), fill)
    for k, v in enumerate(per_table):
        out[k, :len(v)] = v
    return out


_CODE = {t: i for i, t in enumerate(ShardingType)}


def _type_codes(options: Sequence[Sequence[Option]]) -> np.ndarray:
    """(tables, most options): each option's sharding type as its number in :data:`_CODE`, -1 past
    a table's options."""
    return _padded([[_CODE[o.sharding_type] for o in opts] for opts in options], -1).astype(np.int64)


def variants(tables: Sequence[TableSpec], options: Sequence[Sequence[Option]], topo: Topology,
             c: CostConstants, base: Proposal, work=None, all_caps: bool = False) -> List[Proposal]:
    """Proposals the per-table choices of :func:`propose` cannot reach: ``base`` without each
    collective kind it uses (a kind's fixed per-step latency is paid once, by the plan, and so is
    invisible to any one table's choice), and the uniform plans (one sharding type for every
    table). Without a kind, two proposals: the tables of that kind each moved to their least
    work of another type, and, for a base that :func:`propose` made, every table choosing again
    as the base chose (at its theta and memory cap, that kind left out), the proposal the
    planner makes when the config forbids the kind. ``all_caps`` (the best candidate): every
    table choosing again at every cap, that kind left out, for any base: all the proposals of
    the planner the config forbids the kind. At seed shift 559 of the test suite (8 tables on 4
    ranks, the 2-core EPYC's constants) the best, a table-, column- and row-wise plan at theta
    0.25, was 5.1% slower than that planner's least-work proposal without table-wise (theta inf),
    the variant of a proposal whose bound was too far from the best to be a base."""
    work = work or _work_and_memory(tables, options, topo, c)
    totals, sumhbm, cap = work
    out: List[Proposal] = []

    T, types = _padded(totals), _type_codes(options)

    def best(keep: np.ndarray) -> List[Optional[int]]:
        """Each table's option of least work among those ``keep`` marks (None: none marked)."""
        j = np.argmin(np.where(keep, T, np.inf), axis=1)
        return [int(a) if any_ else None for a, any_ in zip(j.tolist(), keep.any(axis=1).tolist())]

    kinds = {options[k][j].sharding_type for k, j in enumerate(base.choice)}
    base_types = types[np.arange(len(options)), list(base.choice)].tolist()
    for kind in sorted(kinds, key=lambda t: t.value) if len(kinds) > 1 else []:
        if all_caps or base.theta is not None:
            caps = None if all_caps else [(base.mem_frac, base.theta)]
            out.extend(propose(tables, options, topo, c, without=kind, caps=caps, work=work))
        other = best((types != _CODE[kind]) & (types >= 0))
        choice = [other[k] if base_types[k] == _CODE[kind] else j for k, j in enumerate(base.choice)]
        if None not in choice:
            out.append(Proposal(f"{base.name} without {kind.value}",      # named by its base: each base has one
                                tuple(_fit_total_memory(choice, totals, sumhbm, cap))))
    for kind in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE):
        choice = best(types == _CODE[kind])
        if None not in choice:
            out.append(Proposal(f"uniform {kind.value}", tuple(_fit_total_memory(choice, totals, sumhbm, cap))))
    return out


def _rank_key(loads: np.ndarray, c: CostConstants) -> Tuple[float, float]:
    """How candidates are ranked: the step model's embedding part (the busiest rank's time,
    what every rank waits for at the next collective), rounded to 0.1%; ties go to the lower
    objective (the better balanced)."""
    mx = float(loads.max())
    return (round(np.log(mx) / np.log(1.001)) if mx > 0 else -np.inf), objective(loads, c.imbalance_weight)


def plan_tables(tables: Iterable[TableSpec], topo: Topology, constants: Optional[CostConstants] = None,
                partitioners: Sequence[str] = PARTITIONERS, alternatives: int = 0) -> Plan:
    """Plan every table; raises :class:`PlanningError` when one cannot be placed.

    ``alternatives``: also keep the next best distinct plans (other sharding types, cache sizes
    or ranks), best first, as plan dicts in ``summary["alternatives"]``."""
    c = constants or CostConstants()
    tables = list(tables)               # a generator would be used up by the first pass
    partitioners = (partitioners,) if isinstance(partitioners, str) else tuple(partitioners)
    bad = [p for p in partitioners if p not in PARTITIONERS]
    if bad:
        raise PlanningError(f"unknown partitioners {bad}; valid: {list(PARTITIONERS)}")
    if not partitioners:
        raise PlanningError(f"partitioners: none given; valid: {list(PARTITIONERS)}")
    if isinstance(alternatives, bool) or not isinstance(alternatives, int) or alternatives < 0:
        raise PlanningError(f"alternatives must be an integer >= 0, got {alternatives!r}")
    if not tables:
        raise PlanningError("no tables to plan")
    wrong = [k for k, t in enumerate(tables) if not isinstance(t, TableSpec)]
    if wrong:
        raise PlanningError(f"tables[{wrong[0]}]: expected a TableSpec, got {type(tables[wrong[0]]).__name__}")
    if any(t.constraints.placement is Placement.AUTO for t in tables):
        try:                          # auto tables on the device when everything fits there
            return _plan(tables, topo, c, partitioners, allow_cache=False, alternatives=alternatives)
        except PlanningError:
            pass
    return _plan(tables, topo, c, partitioners, allow_cache=True, alternatives=alternatives)


def _plan(tables: Sequence[TableSpec], topo: Topology, c: CostConstants, partitioners: Sequence[str],
          allow_cache: bool, alternatives: int = 0) -> Plan:
    options = enumerate_options(tables, topo, c, allow_cache)
    _check_total_memory(tables, options, topo, c)
    work = _work_and_memory(tables, options, topo, c)
    proposals = propose(tables, options, topo, c, work=work)
    best = None
    candidates = []
    feasible = []
    errors: List[PlanningError] = []
    tried, expanded = {p.choice for p in proposals}, set()
    reach = []                         # (rank key of a proposal's lower bound, order, proposal)
    i = 0
    while True:
        if i == len(proposals):        # then the variants of the best so far, once each, and of the
            if best is None:           # proposals whose bound is near it (a few)
                break
            near = [p for k, _, p in sorted(reach) if k <= best[0][0] + _VARIANT_STEPS and p.choice not in expanded]
            all_caps = best[1].choice not in expanded
            if all_caps:
                base = best[1]
            elif near and len(expanded) < _VARIANT_BASES:
                base = near[0]
            else:
                break
            expanded.add(base.choice)
            extra = [p for p in variants(tables, options, topo, c, base, work, all_caps) if p.choice not in tried]
            tried.update(p.choice for p in extra)
            proposals.extend(extra)
            continue
        prop = proposals[i]
        i += 1
        chosen = [options[k][j] for k, j in enumerate(prop.choice)]
        prob, pos_arr, part_arr, group_of = build_problem(tables, chosen, topo, c)
        lat = collective_latency([o.sharding_type for o in chosen], topo, c)
        cost = prob.cost_matrix()
        bound = lower_bound(prob, cost) + lat               # no partition of it can rank above this
        reach.append((_rank_key(np.array([bound]), c)[0], i, prop))
        if best is not None and not alternatives:
            if reach[-1][0] > best[0][0]:
                candidates.append({"proposal": prop.name, "partitioner": "bound", "feasible": None,
                                   "max_ms": bound * 1e3, "max_over_mean": None, "over_bytes": 0.0})
                continue
        results, errs = _run_partitioners(prob, cost, c, partitioners)
        errors.extend(errs)
        for algo, a, loads, ok, over in results:
            loads = loads + lat
            candidates.append({"proposal": prop.name, "partitioner": algo, "feasible": ok,
                               "max_ms": float(loads.max()) * 1e3,
                               "max_over_mean": float(loads.max() / max(loads.mean(), 1e-30)),
                               "over_bytes": max(0.0, over)})
            if ok:
                feasible.append((_rank_key(loads, c), prop, chosen, prob, a, pos_arr, part_arr, group_of, algo))
                if best is None or feasible[-1][0] < best[0]:
                    best = feasible[-1]
    if best is None:
        algos = "/".join(partitioners)
        if candidates:
            least = min(x["over_bytes"] for x in candidates)
            extra = f"; a greedy attempt failed with: {errors[0]}" if errors else ""
            raise PlanningError(
                f"no {algos} plan fits device memory: each of the {len(candidates)} candidates over-fills a rank, "
                f"the least by {least:.0f} bytes ({least / GIB:.2f} GiB){extra}")
        if errors:
            raise errors[0]
        raise PlanningError(f"no {algos} plan could be built")
    # The search costs options at an even share of the bytes per rank; a plan is costed at each
    # rank's own (_rank_sums). The distinct candidates are costed so and ranked by it.
    built, seen = [], set()
    for order, (_, prop, chosen, prob, a, pos_arr, part_arr, group_of, algo) in enumerate(
            sorted(feasible, key=lambda f: f[0])):
        if len(built) > alternatives and len(built) >= _RECOST_MAX:
            break
        part_ranks = _part_ranks(chosen, a, pos_arr, part_arr, group_of, topo.world_size)
        on_rank: Dict[int, set] = {}
        for o, r in zip(chosen, part_ranks):
            for k, rank in enumerate(r.tolist()):
                on_rank.setdefault(rank, set()).add((o.table, k))
        key = (tuple((o.sharding_type, o.cache_fraction, o.num_parts) for o in chosen),   # ranks relabelled: same plan
               frozenset(frozenset(s) for s in on_rank.values()))
        if key in seen:
            continue
        seen.add(key)
        sums = _rank_sums(tables, topo, c, chosen, part_ranks)
        lat = collective_latency([o.sharding_type for o in chosen], topo, c)
        built.append((_rank_key(sums[0] + sums[1] + lat, c), order, chosen, part_ranks, algo, prop, sums))
    built.sort(key=lambda b: (b[0], b[1]))
    plans = [_to_plan(tables, topo, c, chosen, part_ranks,
                      {"partitioner": algo, "proposal": prop.name, "candidates": candidates}, sums)
             for _, _, chosen, part_ranks, algo, prop, sums in built[:alternatives + 1]]
    plans[0].summary["recosted"] = len(built)
    if alternatives:
        plans[0].summary["alternatives"] = [p.to_dict() for p in plans[1:]]
    return plans[0]


def _part_ranks(chosen, a: Assignment, pos_arr, part_arr, group_of, W: int) -> List[np.ndarray]:
    part_ranks: List[np.ndarray] = []
    for o in chosen:
        part_ranks.append(np.arange(W) if o.scope == "fixed" else np.full(o.num_parts, -1, dtype=np.int64))
    for i in range(len(pos_arr)):
        part_ranks[pos_arr[i]][part_arr[i]] = a.rank[i]
    for g, pos in enumerate(group_of):
        part_ranks[pos] = a.group_ranks[g]
    return part_ranks


def evaluate_plan(tables: Sequence[TableSpec], topo: Topology, table_plans: Dict[str, TablePlan],
                  constants: Optional[CostConstants] = None, summary: Optional[dict] = None) -> Plan:
    """Score any placement (e.g. another planner's, or a saved plan's) with Neo's cost model."""
    c = constants or CostConstants()
    chosen, part_ranks, eff = [], [], []
    foot = rank_footprints(table_plans, tables, topo.world_size, c)
    requests, fields = [], []
    for idx, t in enumerate(tables):
        tp = table_plans[t.name]
        sh = tp.shards
        arr = lambda f: np.array([getattr(s, f) for s in sh], dtype=np.int64)  # noqa: E731
        fraction = None
        if tp.placement is Placement.CACHED:
            fraction = tp.cache_load_factor if tp.cache_load_factor is not None else c.cache_load_factor
        eff.append(replace(t, constraints=replace(t.constraints, placement=tp.placement)))
        requests.append((idx, tp.sharding_type, arr("rows"), arr("cols"), fraction, foot[arr("rank")]))
        fields.append((arr("row_offset"), arr("col_offset")))
        part_ranks.append(arr("rank"))
    for (idx, st, rows, cols, fraction, _), (ro, co), costs in zip(requests, fields,
                                                                 estimate_many(tables, requests, topo, c)):
        chosen.append(Option(idx, st, "rank", ro, rows, co, cols, costs, None, fraction))
    return _to_plan(eff, topo, c, chosen, part_ranks, dict(summary or {}))


def _table_plan(o: Option, shards, speeds: np.ndarray) -> TablePlan:
    if o.cache_fraction is None:
        return TablePlan(o.sharding_type, shards, Placement.DEVICE)
    pc = o.costs
    w = np.maximum(pc.distinct, 1e-30)
    hit = float((pc.hit_rate * w).sum() / w.sum())
    miss_ms = float((pc.miss_seconds / speeds).max() * 1e3)     # the slowest part: what a step waits for
    # the table's cache rows: one cache per distinct row range (data-parallel replicas and column
    # shards of the same rows each cache those rows: counted once)
    rows = [r for _, r in {(s.row_offset, s.rows) for s in shards}] if shards else list(o.rows)
    cache_rows = int(sum(np.ceil(o.cache_fraction * r) for r in rows))
    return TablePlan(o.sharding_type, shards, Placement.CACHED, o.cache_fraction, cache_rows, hit, miss_ms)


def _footprints(tables, chosen, part_ranks: List[np.ndarray], W: int) -> np.ndarray:
    """(W,) bytes each rank's fused kernels walk (step_model.rank_footprints of the plan these
    options and ranks make, summed in the same order)."""
    each = []
    for o in chosen:
        rows = o.rows if o.cache_fraction is None else np.ceil(o.rows * o.cache_fraction)
        each.append(rows * tables[o.table].bytes_per_row(o.cols))
    out = np.zeros(W)
    if chosen:
        np.add.at(out, np.concatenate(part_ranks), np.concatenate(each).astype(np.float64))
    return out


_SUMMED = ("compute", "comm", "bytes_intra", "bytes_inter", "hbm", "host")


def _rank_sums(tables, topo, c, chosen, part_ranks: List[np.ndarray]):
    """The chosen options' parts costed at their ranks' own footprints (the search costed them at
    an even share) and summed per rank: (compute (at the ranks' speeds), comm, bytes intra, bytes
    inter, hbm, host), each (W,), the input side included; then the input side's seconds."""
    W = topo.world_size
    speed = np.array([d.speed for d in topo.devices], dtype=np.float64)
    foot = _footprints(tables, chosen, part_ranks, W)
    parts = estimate_joined(tables, [(o.table, o.sharding_type, o.rows, o.cols, o.cache_fraction, foot[ranks],
                                      o.costs.distinct) for o, ranks in zip(chosen, part_ranks)], topo, c, _SUMMED)
    ranks = np.concatenate(part_ranks) if chosen else np.zeros(0, dtype=np.int64)
    parts[0] = parts[0] / speed[ranks]
    in_t, in_bi, in_bo, in_m = _input_side(tables, chosen, topo, c)
    sums = [np.zeros(W) + start for start in (0.0, in_t, in_bi, in_bo, in_m, 0.0)]
    for total, v in zip(sums, parts):
        np.add.at(total, ranks, v)
    return sums + [in_t]


def _to_plan(tables, topo, c, chosen, part_ranks: List[np.ndarray], summary: dict, sums=None) -> Plan:
    """The plan of ``chosen`` with parts on ``part_ranks``; ``sums``: their :func:`_rank_sums`
    when the caller has them."""
    W = topo.world_size
    speed = np.array([d.speed for d in topo.devices], dtype=np.float64)
    out_tables: Dict[str, TablePlan] = {}
    for o, ranks in zip(chosen, part_ranks):
        shards = tuple(Shard(int(r), int(ro), int(rs), int(co), int(cs))
                       for r, ro, rs, co, cs in zip(ranks, o.row_offset, o.rows, o.col_offset, o.cols))
        out_tables[tables[o.table].name] = _table_plan(o, shards, speed[ranks])
    compute, comm, b_in, b_out, hbm, host, in_t = sums or _rank_sums(tables, topo, c, chosen, part_ranks)
    lat = collective_latency([o.sharding_type for o in chosen], topo, c)
    pred = compute + comm + lat
    ranks = tuple(RankStats(r, int(hbm[r]), float(pred[r] * 1e3), float(compute[r] * 1e3),
                            float((comm[r] + lat) * 1e3), float(b_in[r]), float(b_out[r]), int(host[r]))
                  for r in range(W))
    summary = dict(summary, device_kind=c.device_kind, max_ms=float(pred.max() * 1e3), mean_ms=float(pred.mean() * 1e3),
                   imbalance=float(pred.max() / max(pred.mean(), 1e-30)),
                   objective_ms=float(objective(pred, c.imbalance_weight) * 1e3), latency_ms=lat * 1e3,
                   uniform_ms=float((in_t + lat) * 1e3))
    return Plan(W, topo.local_world_size, out_tables, ranks, summary)
