"""Partitioners: greedy vs Karmarkar-Karp vs refinement, and exhaustive optima on tiny cases.

Stated bound (checked below): the refinement is never worse than the better of greedy and
KK (it starts from them and only accepts improvements), hence on identical ranks without
binding memory within Graham's LPT bound 4/3 - 1/(3m) of the optimum; on the tiny cases here
at the exact optimum on every one: on two ranks the descent's pair re-partition tries every
split, on three ranks or more refine evaluates every assignment where there are at most
refine._WHOLE_EXACT_MAX (since 2026-12-07: until then kicks searched them, within 1.05 x the
optimum and at it on at least 97% of the cases, which ``--seed-shift 313`` broke with a case
at 1.069 x: 8 items, 3 ranks). Before that, measured
(2026-12-01): at the exact optimum on every case of this seed (greedy 58/28/50/25% for
identical ranks, heterogeneous speeds, tight memory, both; KK 82/23/56/9%); on 20 other seeds
(2000-2019, 4,341 cases) 100/100/100/99.9%, the worst 1.026 x. Before its kicks could swap
(a tight rank's items changing places), 98.6/97.8/98.3/96.4% there and the worst 1.25 x, up to
1.37 x on seed 1235. The kicks' own seed moves with ``--seed-shift`` too: with 30 kicks,
generator seed 5476's case 34 (8 items, 3 ranks, heterogeneous, tight memory) stayed at
1.072 x for kick seed 4242 (and 24% of 300 kick seeds); with today's default (100 kicks up to
16 items, refine.default_kicks), 1,388 cases of seeds 2000-2004 and 5476 x kick seeds 0-4 and
4242 (2026-12-02): every one at the optimum.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from neo.planner import PlanningError
from neo.planner.partition import Group, Problem, evaluate, fits, greedy, karmarkar_karp, lower_bound
from neo.planner.refine import refine


def problem(rng, n, W, hetero=False, mem_slack=None, L=1, pins=False):
    speed = rng.uniform(0.5, 2.0, W) if hetero else np.ones(W)
    hbm = rng.uniform(1, 10, n)
    cap = np.full(W, hbm.sum() / W * mem_slack if mem_slack else 1e12)
    allowed = np.ones((n, W), dtype=bool)
    if pins:
        allowed[0] = False
        allowed[0, W - 1] = True
    return Problem(L, speed, cap, np.full(W, 1e12), np.zeros(W), np.zeros(W), np.zeros(W),
                   rng.uniform(1, 10, n), rng.uniform(0, 2, n), hbm, np.zeros(n), allowed,
                   tuple(f"t{i}" for i in range(n)))


def exhaustive(p: Problem) -> float:
    cost = p.cost_matrix()
    n, W = cost.shape
    A = np.array(list(itertools.product(range(W), repeat=n)))
    rows = np.arange(len(A))
    loads = np.tile(p.base_load.astype(np.float64), (len(A), 1))
    mem = np.tile(p.base_hbm.astype(np.float64), (len(A), 1))
    ok = np.ones(len(A), dtype=bool)
    for i in range(n):
        np.add.at(loads, (rows, A[:, i]), cost[i, A[:, i]])
        np.add.at(mem, (rows, A[:, i]), p.hbm[i])
        ok &= p.allowed[i, A[:, i]]
    ok &= (mem <= p.hbm_cap).all(axis=1)
    return float(loads.max(axis=1)[ok].min()) if ok.any() else np.inf


def run_all(p):
    out = {}
    starts = []
    for name, fn in (("greedy", greedy), ("kk", karmarkar_karp)):
        try:
            a = fn(p)
        except PlanningError:
            out[name] = np.inf
            continue
        loads, hbm, host = evaluate(p, a)
        out[name] = float(loads.max()) if fits(p, hbm, host) else np.inf
        starts.append((out[name], a))
    vals = []
    for start_val, a in starts:
        loads, hbm, host = evaluate(p, refine(p, a))
        assert fits(p, hbm, host) or not np.isfinite(start_val), "a feasible start stays feasible"
        vals.append(float(loads.max()) if fits(p, hbm, host) else np.inf)
    out["refine"] = min(vals) if vals else np.inf
    return out


@pytest.mark.parametrize("hetero,mem_slack,min_rate", [(False, None, 1.0), (True, None, 1.0), (False, 1.3, 1.0),
                                                       (True, 1.3, 1.0)])
def test_refine_vs_exhaustive_on_tiny_cases(hetero, mem_slack, min_rate):
    rng = np.random.default_rng(1234)
    hits = total = 0
    wins = {"greedy": 0, "kk": 0, "refine": 0}
    for _ in range(60):
        n, W = int(rng.integers(3, 9)), int(rng.integers(2, 4))
        p = problem(rng, n, W, hetero, mem_slack, pins=bool(rng.integers(0, 2)))
        opt = exhaustive(p)
        res = run_all(p)
        if not np.isfinite(opt) or not np.isfinite(min(res["greedy"], res["kk"])):
            continue
        total += 1
        tol = 1e-9 * opt
        assert res["refine"] <= min(res["greedy"], res["kk"]) + tol, "never worse than its starts"
        assert res["refine"] >= opt - tol
        if not hetero and mem_slack is None:
            m = W
            assert res["refine"] <= (4 / 3 - 1 / (3 * m)) * opt + tol, "Graham's LPT bound"
        assert res["refine"] <= opt + tol, "tiny cases: exact (two ranks: the pair re-partition; more: all of them)"
        hits += res["refine"] <= opt + tol
        for k in wins:
            wins[k] += res[k] <= opt + tol
    assert total >= 40
    assert hits / total >= min_rate, (hits, total, wins)
    assert wins["refine"] >= max(wins["greedy"], wins["kk"])


def test_refine_leaves_a_plateau_that_memory_closes_to_moves():
    """Seed 1235's case 50 of the tiny cases, rounded: 4 items, 3 ranks of speeds 0.59 / 1.96 /
    1.12, memory 1.3 x the mean, item 0 pinned to rank 2. Item 1 fits only a rank of its own, so
    the optimum needs items 1 and 3 to change places between the two other ranks before rank 2
    can shed item 2. No move helps; before the kicks could swap, refine stayed at greedy's
    1.37 x the optimum."""
    W, n = 3, 4
    allowed = np.ones((n, W), bool)
    allowed[0] = [False, False, True]
    p = Problem(1, np.array([0.5929, 1.9573, 1.1237]), np.full(W, 8.5889), np.full(W, 1e12), np.zeros(W),
                np.zeros(W), np.zeros(W), np.array([9.4742, 4.0393, 3.8046, 4.2186]),
                np.array([0.9639, 0.545, 0.1072, 0.1125]), np.array([4.5277, 8.5223, 2.9355, 3.835]), np.zeros(n),
                allowed, ("t0", "t1", "t2", "t3"))
    opt = exhaustive(p)
    res = run_all(p)
    assert min(res["greedy"], res["kk"]) > 1.3 * opt, "the case is still the hard one"
    assert res["refine"] == pytest.approx(opt, rel=1e-12)


def test_lower_bound_is_below_every_assignment():
    """The planner skips a proposal whose bound already loses, so the bound must never exceed
    the best assignment (memory aside): checked against the exhaustive optimum without memory
    caps, with bases, pins and heterogeneous speeds; and against greedy's with groups."""
    rng = np.random.default_rng(5)
    tight = 0
    for case in range(120):
        n, W = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        p = problem(rng, n, W, hetero=bool(case % 2), pins=bool(rng.integers(0, 2)))
        p = replace(p, base_load=rng.uniform(0, 5, W) * rng.integers(0, 2))
        opt = exhaustive(p)
        lb = lower_bound(p)
        assert lb <= opt * (1 + 1e-12), (case, lb, opt)
        tight += lb >= 0.9 * opt
    assert tight >= 60, "a bound this loose would prune nothing"
    W, L = 8, 4
    g = Group("twrw", np.array([4.0, 3.0, 2.0, 1.0]), np.full(L, 0.5), np.zeros(L), np.zeros(L), ordered=True)
    for speed in (np.ones(W), rng.uniform(0.5, 2.0, W)):
        p = Problem(L, speed, np.full(W, 1e12), np.full(W, 1e12), np.zeros(W), np.zeros(W), np.zeros(W),
                    rng.uniform(1, 10, 12), rng.uniform(0, 1, 12), np.zeros(12), np.zeros(12),
                    np.ones((12, W), bool), tuple(f"t{k}" for k in range(12)), (g,))
        for start in (greedy(p), karmarkar_karp(p)):
            assert lower_bound(p) <= evaluate(p, refine(p, start))[0].max() * (1 + 1e-12)


def test_kk_beats_greedy_on_classic_instance():
    # {8,7,6,5,4} on 2 ranks: LPT gives 17/13 (max 17), KK/optimum 15/15
    w = np.array([8, 7, 6, 5, 4], dtype=float)
    n, W = len(w), 2
    p = Problem(1, np.ones(W), np.full(W, 1e12), np.full(W, 1e12), np.zeros(W), np.zeros(W), np.zeros(W),
                w, np.zeros(n), np.zeros(n), np.zeros(n), np.ones((n, W), bool), tuple("abcde"))
    g = evaluate(p, greedy(p))[0].max()
    k = evaluate(p, karmarkar_karp(p))[0].max()
    r = evaluate(p, refine(p, greedy(p)))[0].max()
    assert g == 17 and r == 15 and k <= 16


def test_larger_instances_refine_beats_both():
    rng = np.random.default_rng(7)
    better = 0
    for _ in range(5):
        p = problem(rng, 300, 16, hetero=True)
        res = run_all(p)
        assert res["refine"] <= min(res["greedy"], res["kk"]) + 1e-12
        better += res["refine"] < min(res["greedy"], res["kk"]) - 1e-12
        lb = (p.compute.sum() / p.speed.sum())  # speed-weighted lower bound ignoring comm
        assert res["refine"] >= lb
    assert better >= 4


def test_memory_and_pins_respected():
    """40 items on 4 ranks with 15% memory to spare and item 0 pinned to rank 3, refined from
    both starts as the planner does: a start that fits stays fitting, a start over capacity
    (Karmarkar-Karp ignores memory) is repaired, the pin holds, and at least one result fits.
    Greedy places by time and can run out of room (PlanningError on 3 of the generator seeds
    3-39, e.g. 7), which is why the planner has two starts; refine from KK fitted on all 37."""
    rng = np.random.default_rng(3)
    p = problem(rng, 40, 4, mem_slack=1.15, pins=True)
    fitted = []
    for start_fn in (greedy, karmarkar_karp):
        try:
            start = start_fn(p)
        except PlanningError:
            continue
        a = refine(p, start)
        _, hbm, host = evaluate(p, a)
        assert fits(p, hbm, host) or not fits(p, *evaluate(p, start)[1:]), "a fitting start stays fitting"
        assert a.rank[0] == 3
        fitted.append(fits(p, hbm, host))
    assert any(fitted)


def test_groups_go_to_one_node():
    W, L = 8, 4
    g = Group("twrw", np.full(L, 1.0), np.zeros(L), np.ones(L), np.zeros(L), ordered=True)
    p = Problem(L, np.ones(W), np.full(W, 1e12), np.full(W, 1e12), np.array([5.0] * 4 + [0.0] * 4),
                np.zeros(W), np.zeros(W), np.ones(3), np.zeros(3), np.zeros(3), np.zeros(3),
                np.ones((3, W), bool), ("a", "b", "c"), (g,))
    a = greedy(p)
    assert list(a.group_ranks[0]) == [4, 5, 6, 7], "the less loaded node"


def test_group_memory_error_names_table():
    W, L = 4, 2
    g = Group("wide", np.ones(L), np.zeros(L), np.full(L, 10.0), np.zeros(L), ordered=True)
    p = Problem(L, np.ones(W), np.full(W, 5.0), np.full(W, 1e12), np.zeros(W), np.zeros(W), np.zeros(W),
                np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), np.ones((0, W), bool), (), (g,))
    with pytest.raises(PlanningError, match="'wide'.*missing"):
        greedy(p)
