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
``q_r = 1 - exp(-n p_r)`` and ``U = sum q_r``. A cache of ``C`` rows then hits, by its policy
(``TableSpec.cache_policy``):

- ``lfu``: the ``C`` hottest rows, ``sum_{r<=C} q_r / U`` (LFU's limit, the best static cache);
- ``lru``: Che's approximation (Che, Tung and Wang, IEEE JSAC 2002; Fricker, Robert and
  Roberts, ITC 2012), in batches: the cache holds the rows accessed in the last ``T`` batches,
  ``sum_r (1 - (1 - q_r)^T) = C``, and hits ``sum_r q_r (1 - (1 - q_r)^T) / U``;
- ``lookahead`` (the default): a row whose next access is within the ``L`` batches of the window
  is never evicted, so a row survives a gap of ``T + L`` batches: Che's hit rate at ``T + L``
  (``T`` as for LRU), at most the static top-``C`` (where the window needs more rows than the
  cache holds, the window is what limits it).

Against caches simulated batch by batch to their steady state (``tools/check_cache_model.py``:
Zipf 0.8 to 1.2, 200k and 2M rows, 512 to 4096 ids a batch, caches of 1-20%, 30 caches a
policy; docs/cache.md): LRU's model within 0.021 (mean 0.005); lookahead's within 0.025 in 28
of 30 and below the simulation in 29 (-0.067 where a window of 32 batches reads several times
the cache's rows, Zipf 0.8); the top share, which the planner took for every policy before,
is up to 0.17 above an LRU cache and 0.10 above a lookahead one, and up to 0.11 (mean 0.07)
above the simulated LFU, whose counts start cold. Sums over rows are integrals over a
log-spaced grid (no per-row arrays, whatever the table's size).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence, Tuple

import numpy as np

__all__ = ["zipf_batch_model", "hit_rate", "che_hit_rate", "distinct_per_batch", "distinct_per_batch_of", "fit_skew",
           "CACHE_FRACTIONS", "POLICIES"]

POLICIES = ("lfu", "lru", "lookahead")
"""Cache policies the skew model knows (those of :mod:`neo.embedding.cache`)."""

CACHE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""Cache sizes (shares of a table's rows) the planner considers for a table it may cache."""

_GRID = 256


_UNIT = np.linspace(0.0, 1.0, _GRID)


def zipf_batch_model(rows: int, alpha: float, ids_per_batch: float) -> Tuple[float, np.ndarray, np.ndarray]:
    """(distinct rows per batch U, grid of row ranks x, cumulative share of accesses at x).

    ``share(k)`` = fraction of a batch's distinct rows among the ``k`` hottest rows; read it
    with :func:`np.interp` in log(k). Memoized (the planner asks for the same table part under
    several sharding options): the arrays are read-only."""
    U, x, share, _ = _zipf_grid(rows, alpha, ids_per_batch)
    return U, x, share


@functools.lru_cache(maxsize=65536)
def _zipf_grid(rows: int, alpha: float, ids_per_batch: float) -> Tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`zipf_batch_model` plus ``q`` at the grid's ranks (the chance a batch reads that row)."""
    n = max(float(ids_per_batch), 0.0)
    if rows <= 0 or n == 0:
        x = _frozen(np.array([1.0, max(rows, 1)]))
        return 0.0, x, _frozen(np.array([0.0, 1.0])), _frozen(np.zeros(2))
    if rows < _GRID:
        x = _small_grid(rows)
        q, cum = _batch_odds(x, rows, alpha, n)
    else:
        x, q, cum = (v[0] for v in _zipf_grids(np.array([rows]), alpha, np.array([n])))
    U = float(cum[-1])
    return U, _frozen(x), _frozen(cum / U), _frozen(q)


def _small_grid(rows) -> np.ndarray:
    """The ranks of a table of fewer than ``_GRID`` rows: log-spaced points would repeat ranks."""
    return np.unique(np.geomspace(1.0, float(rows), _GRID))


def _zipf_grids(rows: np.ndarray, alpha: float, n: np.ndarray):
    """(x, q, cum) of :func:`_zipf_grid` for tables of ``rows`` >= ``_GRID`` rows and ``n`` > 0 ids a
    batch, one grid per row (K, _GRID): the grids of many tables part at once."""
    x = np.exp(_UNIT * np.array([[math.log(r)] for r in rows.tolist()]))   # = geomspace(1, rows), ends exact below
    x[:, 0], x[:, -1] = 1.0, rows
    q, cum = _batch_odds(x, rows, alpha, n)
    return x, q, cum


def _batch_odds(x: np.ndarray, rows, alpha: float, n):
    """(q, cum): the chance a batch of ``n`` ids reads the row of rank ``x`` (grids along the last
    axis, one per entry of ``rows`` and ``n``), and its running sum over ranks (the first row
    itself, then trapezoids): cum's last point is U."""
    lead = x.shape[:-1]
    rs = np.broadcast_to(np.asarray(rows, dtype=np.float64), lead).ravel().tolist()
    ns = np.broadcast_to(np.asarray(n, dtype=np.float64), lead).ravel().tolist()

    def column(values):                          # one value per grid, against its points
        return np.array(values, dtype=np.float64).reshape(lead + (1,))

    if alpha <= 1e-9:
        q = np.ones_like(x) * column([1.0 - math.exp(-b / r) for r, b in zip(rs, ns)])
    else:
        if abs(alpha - 1.0) < 1e-9:
            H = [math.log(r) + 0.5772156649 for r in rs]
        else:
            H = [(r ** (1.0 - alpha) - 1.0) / (1.0 - alpha) + 0.5 * (1.0 + r ** -alpha) for r in rs]
        q = -np.expm1(-column(ns) * x ** -alpha / column(H))        # P(row of rank x is in the batch)
    seg = 0.5 * (q[..., 1:] + q[..., :-1]) * np.diff(x, axis=-1)
    cum = np.concatenate([q[..., :1], q[..., :1] + np.cumsum(seg, axis=-1)], axis=-1)
    return q, cum


def distinct_per_batch_of(rows: np.ndarray, alpha: np.ndarray, ids_per_batch: np.ndarray) -> np.ndarray:
    """:func:`distinct_per_batch` of each entry (equal-length arrays), the grids of many entries
    computed together: those of ``_GRID`` rows or more one skew at a time, the smaller ones one
    number of rows and skew at a time (the same numbers as one by one; the planner costs the
    parts of about 9,000 options of 1,000 tables in a few calls)."""
    rows = np.trunc(np.asarray(rows, dtype=np.float64))            # whole rows, as int() of one
    alpha = np.asarray(alpha, dtype=np.float64)
    n = np.maximum(np.asarray(ids_per_batch, dtype=np.float64), 0.0)
    out = np.zeros(len(rows))
    big = (rows >= _GRID) & (n > 0)
    for a in np.unique(alpha[big]).tolist():
        sel = big & (alpha == a)
        out[sel] = _zipf_grids(rows[sel], a, n[sel])[2][:, -1]
    small = (rows >= 1) & (rows < _GRID) & (n > 0)     # a grid per number of rows: its distinct ranks
    for r, a in set(zip(rows[small].tolist(), alpha[small].tolist())):
        sel = small & (rows == r) & (alpha == a)
        x = _small_grid(r)
        out[sel] = _batch_odds(np.broadcast_to(x, (int(sel.sum()), len(x))), r, a, n[sel])[1][:, -1]
    return out


def _over_rows(x: np.ndarray, v: np.ndarray) -> float:
    """The sum over ranks 1..rows of ``v`` given at the grid's ranks ``x`` (the first row itself,
    then trapezoids), as :func:`zipf_batch_model` sums ``q``."""
    return float(v[0] + np.sum(0.5 * (v[1:] + v[:-1]) * np.diff(x)))


@functools.lru_cache(maxsize=65536)
def che_hit_rate(rows: int, alpha: float, ids_per_batch: float, capacity: float, extra_batches: float = 0.0) -> float:
    """Che's approximation, in batches: the share of a batch's distinct rows a cache of
    ``capacity`` rows finds when every row accessed in the last ``T`` batches is resident
    (``sum_r 1 - (1 - q_r)^T = capacity``) and a row survives gaps of ``T + extra_batches``
    batches (0: LRU; the lookahead window's length: the lookahead policy)."""
    U, x, _, q = _zipf_grid(rows, alpha, ids_per_batch)
    if U <= 0:
        return 0.0
    if capacity >= rows:
        return 1.0
    log_miss = np.log1p(-np.minimum(q, 1.0 - 1e-15))              # log(1 - q_r) at the grid's ranks
    resident = lambda T: _over_rows(x, -np.expm1(T * log_miss))   # noqa: E731  rows read in T batches
    lo, hi = 0.0, 1.0
    while resident(hi) < capacity and hi < 1e15:
        lo, hi = hi, hi * 2.0
    for _ in range(60):                                              # bisection: resident(T) grows with T
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if resident(mid) < capacity else (lo, mid)
    T = 0.5 * (lo + hi) + max(0.0, float(extra_batches))
    return float(min(1.0, _over_rows(x, q * -np.expm1(T * log_miss)) / U))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def hit_rate(fraction: float, rows: int, alpha: float, ids_per_batch: float,
             curve: Sequence[Tuple[float, float]] = (), policy: str = "lfu", lookahead: int = 0) -> float:
    """Share of a batch's distinct rows found in a cache of ``fraction`` of ``rows``.

    ``curve``: measured (fraction, hit rate) points; interpolated in log(fraction) and clamped
    to its ends (0 below the smallest point when it is above 0, its last value above). Without
    one, the skew model of the cache's ``policy`` (``lfu``, ``lru`` or ``lookahead`` with a
    window of ``lookahead`` batches; see the module doc)."""
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
    if policy not in POLICIES:
        raise ValueError(f"cache policy must be one of {POLICIES}, got {policy!r}")
    _, x, share = zipf_batch_model(rows, alpha, ids_per_batch)
    k = f * rows
    top = float(share[0] * k) if k < 1.0 else float(np.interp(math.log(k), np.log(x), share))
    if policy == "lfu":
        return top
    return min(top, che_hit_rate(rows, alpha, ids_per_batch, k, lookahead if policy == "lookahead" else 0.0))


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
