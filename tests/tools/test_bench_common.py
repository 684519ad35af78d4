"""tools/bench_common.py: the orders benchmarks interleave their systems in, and the calls of an
interleaved benchmark."""

from __future__ import annotations

import collections
import math
import random

import pytest

from tests.tools import load_tool

bench_common = load_tool("bench_common.py")
balanced_orders = bench_common.balanced_orders


@pytest.mark.parametrize("n", range(1, 10))
def test_each_system_runs_right_after_each_other_one_equally_often(n):
    orders = balanced_orders(n)
    assert len(orders) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(row) == list(range(n)) for row in orders)           # every system once per order
    after = collections.Counter((a, b) for row in orders for a, b in zip(row, row[1:]))
    times = 1 if n % 2 == 0 else 2
    assert after == {(a, b): times for a in range(n) for b in range(n) if a != b}
    firsts = collections.Counter(row[0] for row in orders)
    assert firsts == {a: times for a in range(n)}                          # and goes first as often


@pytest.mark.parametrize("n", range(1, 10))
def test_no_system_runs_right_after_itself_in_the_call_orders(n):
    orders = bench_common.call_orders(n)
    assert len(orders) == len(balanced_orders(n))
    assert all(sorted(row) == list(range(n)) for row in orders)           # every system once per order
    calls = [j for row in orders for j in row]
    after = collections.Counter((calls[i], calls[(i + 1) % len(calls)]) for i in range(len(calls)))  # the cycle
    if n == 1:
        return
    assert all(a != b for a, b in after)                                   # never right after itself
    assert set(after) == {(a, b) for a in range(n) for b in range(n) if a != b}
    if n <= 3:                                                             # the rotated ones: exactly balanced
        assert len(set(after.values())) == 1
    else:                                                                  # unchanged from the Williams rows
        assert orders == balanced_orders(n)


@pytest.mark.parametrize("n, warmup, iters", [(1, 0, 3), (2, 2, 5), (3, 1, 7), (4, 3, 4)])
def test_interleaved_calls_every_system_once_an_iteration_in_the_balanced_order(n, warmup, iters):
    calls = list(bench_common.interleaved(n, warmup, iters))
    orders = bench_common.call_orders(n)
    assert [j for _, j in calls] == [j for i in range(warmup + iters) for j in orders[i % len(orders)]]
    assert [timed for timed, _ in calls] == [False] * (warmup * n) + [True] * (iters * n)
    timed = collections.Counter(j for t, j in calls if t)
    assert timed == {j: iters for j in range(n)}                            # every system timed iters times


KEYS = [("all_to_all", "shm"), ("all_to_all", "gloo"), ("all_gather", "shm"), ("all_gather", "gloo")]


def test_time_interleaved_runs_every_call_once_per_iteration_in_a_rotating_order():
    """bench_collectives' use: four calls, a barrier before each, the order from the round's index
    alone (every rank runs the same collectives in the same order)."""
    from tests.tools.test_bench_collectives import _check_interleaved

    seq, barriers = [], []
    calls = {k: (lambda k=k: seq.append(k)) for k in KEYS}
    timed = bench_common.time_interleaved(calls, warmup=2, iters=6, before=lambda: barriers.append(len(seq)))
    _check_interleaved(seq, KEYS, 8)
    assert barriers == list(range(len(seq)))                          # a barrier before every call
    assert set(timed) == set(KEYS) and all(min(t.wall) >= 0 and min(t.cpu) >= 0 for t in timed.values())
    assert all(len(t.wall) == len(t.cpu) == 6 for t in timed.values())
    seq2 = []                                                         # the order: from the index alone
    bench_common.time_interleaved({k: (lambda k=k: seq2.append(k)) for k in KEYS}, 2, 6)
    assert seq2 == seq


def _binomial_tail(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k), from the exact counts."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


@pytest.mark.parametrize("n", range(1, 61))
def test_median_ci_takes_the_innermost_ranks_with_95_percent_coverage(n):
    values = [float(v) for v in range(100, 100 + n)]
    lo, hi = bench_common.median_ci(values[::-1])          # order of the input does not matter
    k = int(lo) - 100 + 1                                   # the lower end's rank (1-based)
    assert hi == values[n - k]                              # symmetric ranks
    if n < 6:
        assert (lo, hi) == (values[0], values[-1])          # 95% is out of reach: the range
        return
    assert 1 - 2 * _binomial_tail(n, k - 1) >= 0.95         # covers the median at least 95% ...
    assert 1 - 2 * _binomial_tail(n, k) < 0.95              # ... and the next ranks inward would not


def test_median_ci_matches_the_tables_and_covers_a_known_median():
    assert bench_common.median_ci(list(range(1, 31))) == (10, 21)    # the textbook ranks at n 30 and 100
    assert bench_common.median_ci(list(range(1, 101))) == (40, 61)
    rng = random.Random(0)
    trials, covered = 2000, 0
    for _ in range(trials):                                  # exponential draws: the median is ln 2
        lo, hi = bench_common.median_ci([rng.expovariate(1.0) for _ in range(30)])
        covered += lo <= math.log(2) <= hi
    assert 0.94 <= covered / trials <= 0.99                  # at n 30 the exact coverage is 95.7%
    with pytest.raises(ValueError):
        bench_common.median_ci([])
