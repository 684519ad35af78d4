"""The partition stage of the planner (:mod:`neo.planner.planner`): the partitioning problem of
one proposal (:func:`build_problem`) and the partitioners run on it, with the input side's cost
(the per-rank base every option adds) that the problem and the planner's estimates share."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from neo.planner.constants import CostConstants
from neo.planner.cost import input_side_cost
from neo.planner.enumerate import Option
from neo.planner.partition import Group, Problem, evaluate, fits, greedy, karmarkar_karp, objective
from neo.planner.refine import refine
from neo.planner.types import PlanningError, ShardingType, TableSpec, Topology


def _input_side(tables: Sequence[TableSpec], opts: Sequence[Option], topo: Topology, c: CostConstants):
    t = bi = bo = m = 0.0
    for o in opts:
        s, a, b, mem = input_side_cost(tables[o.table], o.sharding_type, topo, c)
        t, bi, bo, m = t + s, bi + a, bo + b, m + mem
    return t, bi, bo, m


def build_problem(tables: Sequence[TableSpec], chosen: Sequence[Option], topo: Topology, c: CostConstants):
    """The partitioning problem of one proposal, and the maps back from items to options."""
    W, L = topo.world_size, topo.local_world_size
    speed = np.array([d.speed for d in topo.devices], dtype=np.float64)
    hbm_cap = np.array([d.hbm_bytes for d in topo.devices], dtype=np.float64) * (1 - c.memory_headroom)
    host_cap = np.array([d.host_bytes for d in topo.devices], dtype=np.float64)
    in_t, _, _, in_m = _input_side(tables, chosen, topo, c)
    base_load, base_hbm, base_host = np.full(W, in_t), np.full(W, in_m), np.zeros(W)
    single_rows: List[Tuple[int, int]] = []  # (option position, part)
    groups: List[Group] = []
    group_of: List[int] = []
    for pos, o in enumerate(chosen):
        pc = o.costs
        if o.scope == "fixed":
            base_load = base_load + pc.compute / speed + pc.comm
            base_hbm, base_host = base_hbm + pc.hbm, base_host + pc.host
        elif o.scope == "node":
            groups.append(Group(tables[o.table].name, pc.compute, pc.comm, pc.hbm, pc.host,
                                ordered=o.sharding_type is ShardingType.TABLE_ROW_WISE))
            group_of.append(pos)
        else:
            single_rows.extend((pos, k) for k in range(o.num_parts))
    n = len(single_rows)
    pos_arr = np.array([p for p, _ in single_rows], dtype=np.int64)
    part_arr = np.array([k for _, k in single_rows], dtype=np.int64)

    def gather(attr):
        return np.array([getattr(chosen[p].costs, attr)[k] for p, k in single_rows], dtype=np.float64)

    allowed = np.ones((n, W), dtype=bool)
    for i, (p, _) in enumerate(single_rows):
        if chosen[p].allowed_ranks:
            allowed[i] = False
            allowed[i, list(chosen[p].allowed_ranks)] = True
    names = tuple(tables[chosen[p].table].name for p, _ in single_rows)
    prob = Problem(L, speed, hbm_cap, host_cap, base_load, base_hbm, base_host, gather("compute"),
                   gather("comm"), gather("hbm"), gather("host"), allowed, names, tuple(groups))
    return prob, pos_arr, part_arr, group_of


def _over_bytes(prob: Problem, hbm: np.ndarray, host: np.ndarray) -> float:
    """Largest excess of a rank's memory over its capacity (<= 0: fits)."""
    return float(max((hbm - prob.hbm_cap).max(), (host - prob.host_cap).max()))


def _run_partitioners(prob: Problem, cost: np.ndarray, c: CostConstants, allowed_algos: Sequence[str]):
    """[(algorithm, assignment, loads, fits, bytes over capacity)], [errors]; ``cost``:
    ``prob.cost_matrix()``."""
    results = []
    starts = []
    errors = []
    for name, fn in (("greedy", greedy), ("karmarkar_karp", karmarkar_karp)):
        try:
            a = fn(prob, cost)
        except PlanningError as e:
            errors.append(e)
            continue
        loads, hbm, host = evaluate(prob, a, cost)
        ok = fits(prob, hbm, host)
        results.append((name, a, loads, ok, _over_bytes(prob, hbm, host)))
        starts.append((not ok, objective(loads, c.imbalance_weight), a))
    refined = []
    for _, _, start in starts:  # refine from both starts, keep the better
        a = refine(prob, start, cost, imbalance_weight=c.imbalance_weight)
        loads, hbm, host = evaluate(prob, a, cost)
        ok = fits(prob, hbm, host)
        refined.append((not ok, objective(loads, c.imbalance_weight), a, loads, ok, _over_bytes(prob, hbm, host)))
    if refined:
        _, _, a, loads, ok, over = min(refined, key=lambda r: (r[0], r[1]))
        results.append(("refine", a, loads, ok, over))
    return [r for r in results if r[0] in allowed_algos], errors
