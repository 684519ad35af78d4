"""Miss-ratio curves of cached tables: what a cache of a given size saves per step.

A cached table moves only the rows a batch needs and does not find in its cache. Per step the
shard's lookups ask for ``U`` distinct rows (accesses, as ``neo cache-report`` counts them);
a cache holding a fraction ``f`` of the rows hits ``h(f)`` of them; each miss moves one row in
from the backing store and, on average, one dirty row back out.

``h`` and ``U`` come from a measured curve when the planner was given one (``TableSpec.hit_curve``
and ``distinct_per_batch``, measured by ``neo cache-report``'s simulator on a sample of the
data: see :func:`neo.train.build.measure_cache_curves`), else from a built-in skew model: ids
drawn independently from Zipf(alpha) over the rows (alpha = ``access_skew``; 0 = uniform). With
``n`` ids per batch, row ``r`` of probability ``p_r`` is accessed by a batch with probability
``q_r = 1 - exp(-n p_r)``; ``U = sum q_r`` and a cache of the ``k`` hottest rows hits
``sum_{r<=k} q_r / U`` of the accesses (the limit of LFU; Belady-like policies do a little
better, so the model errs on the side of misses). Sums over rows are integrals over a
log-spaced grid (no per-row arrays, whatever the table's size).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence, Tuple

import numpy as np

__all__ = ["zipf_batch_model", "hit_rate", "distinct_per_batch", "fit_skew", "CACHE_FRACTIONS"]

CACHE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""Cache sizes (shares of a table's rows) the planner considers for a table it may cache."""

_GRID = 256


_UNIT = np.linspace(0.0, 1.0, _GRID)


@functools.lru_cache(maxsize=65536)
def zipf_batch_model(rows: int, alpha: float, ids_per_batch: float) -> Tuple[float, np.ndarray, np.ndarray]:
    """(distinct rows per batch U, grid of row ranks x, cumulative share of accesses at x).

    ``share(k)`` = fraction of a batch's distinct rows among the ``k`` hottest rows; read it
    with :func:`np.interp` in log(k). Memoized (the planner asks for the same table part under
    several sharding options): the arrays are read-only."""
    n = max(float(ids_per_batch), 0.0)
    if rows <= 0 or n == 0:
        return 0.0, _frozen(np.array([1.0, max(rows, 1)])), _frozen(np.array([0.0, 1.0]))
    if rows < _GRID:                                     # log-spaced points would repeat ranks
        x = np.unique(np.geomspace(1.0, float(rows), _GRID))
    else:
        x = np.exp(_UNIT * math.log(rows))                 # = geomspace(1, rows), ends exact below
        x[0], x[-1] = 1.0, float(rows)
    if alpha <= 1e-9:
        q = np.full_like(x, 1.0 - math.exp(-n / rows))
    else:
        if abs(alpha - 1.0) < 1e-9:
            H = math.log(rows) + 0.5772156649
        else:
            H = (rows ** (1.0 - alpha) - 1.0) / (1.0 - alpha) + 0.5 * (1.0 + rows ** -alpha)
        q = -np.expm1(-n * x ** -alpha / H)                  # P(row of rank x is in the batch)
    # integral of q over ranks [1, x], trapezoids on the grid, plus the first row itself
    seg = 0.5 * (q[1:] + q[:-1]) * np.diff(x)
    cum = np.concatenate([[q[0]], q[0] + np.cumsum(seg)])
    U = float(cum[-1])
    return U, _frozen(x), _frozen(cum / U)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def hit_rate(fraction: float, rows: int, alpha: float, ids_per_batch: float,
             curve: Sequence[Tuple[float, float]] = ()) -> float:
    """Share of a batch's distinct rows found in a cache of ``fraction`` of ``rows``.

    ``curve``: measured (fraction, hit rate) points; interpolated in log(fraction) and clamped
    to its ends (0 below the smallest point when it is above 0, its last value above)."""
    f = min(max(fraction, 0.0), 1.0)
    if f >= 1.0:
        return 1.0
    if curve:
        pts = sorted(curve)
        xs = np.log([max(p[0], 1e-12) for p in pts])
        ys = [p[1] for p in pts]
        if f <= 0:
            return 0.0
        return float(np.clip(np.interp(math.log(f), xs, ys, left=ys[0] * f / pts[0][0], right=ys[-1]), 0.0, 1.0))
    _, x, share = zipf_batch_model(rows, alpha, ids_per_batch)
    k = f * rows
    if k < 1.0:
        return float(share[0] * k)
    return float(np.interp(math.log(k), np.log(x), share))


def distinct_per_batch(rows: int, alpha: float, ids_per_batch: float) -> float:
    """Expected distinct rows among ``ids_per_batch`` Zipf(alpha) draws over ``rows`` rows."""
    return zipf_batch_model(rows, alpha, ids_per_batch)[0]


def fit_skew(rows: int, ids_per_batch: float, distinct: float, iters: int = 60) -> float:
    """The Zipf exponent under which ``ids_per_batch`` draws over ``rows`` rows give ``distinct``
    distinct rows on average (the skew model's U, which falls as the exponent grows): 0 where
    even uniform ids repeat more than that, at most 4. Bisection; the planner's fallback where a
    measured cache does not warm up within the sample (:func:`neo.train.build.measure_cache_curves`)."""
    if rows <= 0 or ids_per_batch <= 0 or distinct >= distinct_per_batch(rows, 0.0, ids_per_batch):
        return 0.0
    lo, hi = 0.0, 4.0
    if distinct <= distinct_per_batch(rows, hi, ids_per_batch):
        return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if distinct_per_batch(rows, mid, ids_per_batch) > distinct:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
