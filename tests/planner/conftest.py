"""Shared builders for the planner tests."""

import numpy as np
import pytest

from neo.planner import TableConstraints, TableSpec


def production_like_tables(n: int, seed: int = 0, max_rows: float = 1e8):
    """Rows log-uniform in [10, max_rows], dims 16..256, Pareto-skewed pooling factors."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(10 ** rng.uniform(1, np.log10(max_rows)))
        dim = int(rng.choice([16, 32, 64, 128, 256], p=[0.15, 0.25, 0.35, 0.2, 0.05]))
        pf = float(min(200.0, rng.pareto(1.2) + 1.0))
        out.append(TableSpec(f"t{i}", rows, dim, weight_bytes=int(rng.choice([2, 4])), state_floats_per_row=1,
                             pooling_factor=pf, access_skew=1.0))
    return out


def table(name, rows, dim, types=(), ranks=(), width=None, pf=1.0, **kw):
    return TableSpec(name, rows, dim, state_floats_per_row=1, pooling_factor=pf,
                     constraints=TableConstraints(tuple(types), tuple(ranks), width), **kw)


@pytest.fixture
def make_tables():
    return production_like_tables


@pytest.fixture
def make_table():
    return table
