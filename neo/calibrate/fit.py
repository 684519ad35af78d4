"""Fitting the cost model's constants to measurements (pure numpy).

Every measured time is a sum of non-negative costs, each a known count (bags, ids, bytes,
flops, layers, calls) times an unknown constant; the constants are the non-negative least
squares solution, in relative error (each measurement weighted by 1 / its time, so a 50 us
call counts as much as a 50 ms one). :func:`nnls` is Lawson and Hanson's active-set method.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["nnls", "fit_linear", "relative_errors"]


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """x >= 0 minimizing ||A x - b|| (Lawson-Hanson)."""
    m, n = A.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = A.T @ (b - A @ x)
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= 1e-12 * max(1.0, np.abs(w).max())).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg] + 1e-300))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        w = A.T @ (b - A @ x)
    return x


def fit_linear(rows: Sequence[Dict[str, float]], terms: Sequence[str], target: str = "seconds",
               floor: Dict[str, float] = None) -> Tuple[Dict[str, float], float]:
    """Constants per term (non-negative) so that sum(term count x constant) ~ target, in relative
    error; returns them and the median relative error of the fit. ``floor``: smallest value each
    constant may report (a constant the data cannot see stays tiny but positive)."""
    A = np.array([[float(r[t]) for t in terms] for r in rows], dtype=np.float64)
    b = np.array([float(r[target]) for r in rows], dtype=np.float64)
    wgt = 1.0 / np.maximum(b, 1e-12)
    scale = np.maximum(np.abs(A * wgt[:, None]).max(axis=0), 1e-300)      # condition the columns
    x = nnls(A * wgt[:, None] / scale, b * wgt) / scale
    floor = floor or {}
    out = {t: max(float(v), floor.get(t, 0.0)) for t, v in zip(terms, x)}
    err = relative_errors(rows, out, terms, target)
    return out, float(np.median(np.abs(err))) if len(err) else 0.0


def relative_errors(rows: Sequence[Dict[str, float]], consts: Dict[str, float], terms: Sequence[str],
                    target: str = "seconds") -> List[float]:
    return [sum(float(r[t]) * consts[t] for t in terms) / float(r[target]) - 1.0 for r in rows]
