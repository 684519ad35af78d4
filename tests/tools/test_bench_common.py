"""tools/bench_common.py: the orders benchmarks interleave their systems in."""

from __future__ import annotations

import collections

import pytest

from tests.tools import load_tool

balanced_orders = load_tool("bench_common.py").balanced_orders


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

