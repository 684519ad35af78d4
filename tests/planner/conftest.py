"""Shared builders for the planner tests."""

import pytest

from neo.planner import TableConstraints, TableSpec
from neo.planner.workloads import production_like_tables


def table(name, rows, dim, types=(), ranks=(), width=None, pf=1.0, **kw):
    return TableSpec(name, rows, dim, state_floats_per_row=1, pooling_factor=pf,
                     constraints=TableConstraints(tuple(types), tuple(ranks), width), **kw)


@pytest.fixture
def make_tables():
    return production_like_tables


@pytest.fixture
def make_table():
    return table
