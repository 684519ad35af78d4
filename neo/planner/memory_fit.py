"""Fitting the planner's choices into the cluster's device memory (:mod:`neo.planner.planner`):
moving tables to options with less memory until the chosen options fit, and the check that even
the most compact options can fit at all."""

from __future__ import annotations

from typing import List

import numpy as np

from neo.planner.constants import CostConstants
from neo.planner.partition_step import _input_side
from neo.planner.types import GIB, PlanningError, Topology


def _fit_total_memory(choice: List[int], totals, sumhbm, cap: float) -> List[int]:
    """Move tables to options with less memory (fewer cached rows, or cached instead of on the
    device), least seconds added per byte saved first, until the chosen options fit ``cap``.
    Each table's cheapest move is kept and only the moved table's is computed again."""
    choice = list(choice)
    need = sum(float(h[j]) for h, j in zip(sumhbm, choice))
    if need <= cap:
        return choice
    n = len(choice)
    ratio, move, valid = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)

    def update(k: int) -> None:
        cheapest = _cheapest_move(sumhbm[k], totals[k], choice[k])
        valid[k] = cheapest is not None
        if valid[k]:
            ratio[k], move[k] = cheapest

    for k in range(n):
        update(k)
    while need > cap:
        idx = np.flatnonzero(valid)
        if not len(idx):
            break
        r = ratio[idx]
        if np.isnan(r).any():          # the first table, then any strictly cheaper (NaN never is)
            k = int(idx[0])
            for q in idx[1:].tolist():
                if ratio[q] < ratio[k]:
                    k = q
        else:
            k = int(idx[np.argmin(r)])   # the cheapest; ties: the first table
        m = int(move[k])
        need -= float(sumhbm[k][choice[k]] - sumhbm[k][m])
        choice[k] = m
        update(k)
    return choice


def _cheapest_move(h: np.ndarray, t: np.ndarray, j: int):
    """(seconds added per byte saved, option) of a table's cheapest move from option ``j`` to one
    with less memory (``h``: each option's bytes, ``t``: its seconds); None when none saves any."""
    saves = h[j] - h
    ok = (saves > 0) & np.isfinite(t)           # (a variant's left-out kind: inf)
    if not ok.any():
        return None
    ratio = np.where(ok, (t - t[j]) / np.where(ok, saves, 1.0), np.inf)
    # among the moves of this table, the cheapest per byte; ties: the one saving most
    m = int(np.lexsort((-saves, ratio))[0])
    return ratio[m], m


def _check_total_memory(tables, options, topo: Topology, c: CostConstants) -> None:
    """Raise when even the most compact option of every table cannot fit the whole cluster."""
    cap = sum(d.hbm_bytes for d in topo.devices) * (1 - c.memory_headroom)
    need_each = [min(float(o.costs.hbm.sum()) for o in opts) for opts in options]
    need = sum(need_each) + _input_side(tables, [opts[0] for opts in options], topo, c)[3] * topo.world_size
    if need > cap:
        big = sorted(range(len(tables)), key=lambda k: -need_each[k])[:3]
        names = ", ".join(f"'{tables[k].name}' ({need_each[k] / GIB:.2f} GiB)" for k in big)
        raise PlanningError(
            f"the tables need at least {need:.0f} bytes ({need / GIB:.2f} GiB) of device memory in total but the "
            f"{topo.world_size} ranks have {cap:.0f} bytes ({cap / GIB:.2f} GiB): {need - cap:.0f} bytes "
            f"({(need - cap) / GIB:.2f} GiB) missing; largest tables: {names} (placement: cached keeps a "
            f"cache of a table's hot rows in device memory and every row in host memory or on disk)")
