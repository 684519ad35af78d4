"""Synthetic table sets for planner tests and benchmarks."""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from neo.planner.types import TableSpec


def production_like_tables(n: int, seed: int = 0, max_rows: float = 1e8,
                           rng: Optional[np.random.Generator] = None) -> List[TableSpec]:
    """Rows log-uniform in [10, max_rows]; dims 16..256; pooling factors 1 + Pareto(1.2) capped at 200.

    The spread of sizes and the heavy-tailed pooling factors resemble the production table
    sets described in the Neo paper (Mudigere et al. 2022, Sec. 2); fp16 or fp32 weights,
    row-wise state (one fp32 per row). Drawn from ``rng`` when given, else from ``seed``.
    """
    rng = np.random.default_rng(seed) if rng is None else rng
    out = []
    for i in range(n):
        rows = int(10 ** rng.uniform(1, np.log10(max_rows)))
        dim = int(rng.choice([16, 32, 64, 128, 256], p=[0.15, 0.25, 0.35, 0.2, 0.05]))
        pf = float(min(200.0, rng.pareto(1.2) + 1.0))
        out.append(TableSpec(f"t{i}", rows, dim, weight_bytes=int(rng.choice([2, 4])), state_floats_per_row=1,
                             pooling_factor=pf, access_skew=1.0))
    return out


def production_like_config(n: int, world_size: int = 128, local_world_size: int = 8, seed: int = 0,
                           hbm_gib: float = 80.0) -> dict:
    """A Neo config (``tables`` and ``topology`` sections, as YAML would parse) of ``n`` tables with
    production-like sizes: rows log-uniform in [1k, 100M], dims 4..256, pooling factors 1 +
    Pareto(1.2) capped at 100, fp16 or fp32, row-wise Adagrad (``tools/bench_planner.py`` times
    ``neo plan`` on it end to end)."""
    rng = np.random.default_rng(seed)
    tables = []
    for i in range(n):
        tables.append({"name": f"t{i}", "num_rows": int(10 ** rng.uniform(3, 8)),
                       "dim": int(rng.choice([4, 8, 16, 32, 64, 128, 256], p=[0.05, 0.1, 0.15, 0.25, 0.25, 0.15, 0.05])),
                       "pooling_factor": round(float(min(100.0, rng.pareto(1.2) + 1.0)), 2),
                       "dtype": str(rng.choice(["fp16", "fp32"])), "access_skew": 1.0,
                       "optimizer": {"type": "rowwise_adagrad", "lr": 0.01}})
    return {"topology": {"world_size": world_size, "local_world_size": local_world_size, "hbm_gib": hbm_gib},
            "tables": tables}
