"""Measured steps, in the components the planner predicts (:mod:`neo.planner.step_model`).

Each training step records its wall time and the seconds of every phase timer
(:class:`neo.train.step.Timers`) spent in it. The summary takes the steady state: the steps
after the first ``max(3, 10%)``, and of those the ones between the 25th and 75th percentile of
step time (a robust median: no first-window data read, no page-fault storm, no straggler). Its
``step_ms`` is their mean and its components are their means, so they add up to it:

- ``embedding_fwd``: the lookup (a cached table's prefetch wait included);
- ``embedding_bwd``: the fused backward + optimizer, measured inside the autograd backward;
- ``input_dist``: waiting for and launching the ids' redistribution;
- ``output_dist``: the pooled embeddings' collectives, forward and backward;
- ``dense``: MLPs, interaction, loss, their backward with DDP's AllReduce, the dense optimizer;
- ``data``: waiting for the loader;
- ``other``: the rest of the loop.
"""

from __future__ import annotations

from array import array
from typing import Dict, List

import numpy as np

__all__ = ["StepStats"]


class StepStats:
    """Per step, 8 bytes per timer in flat ``array('d')`` columns (a dict per step cost about
    800 bytes: 16 MB over a 20,000-step run, visible as memory growth in ``tools/soak.py``)."""

    def __init__(self) -> None:
        self.steps = array("d")
        self.phases: Dict[str, array] = {}      # timer -> its seconds in each step (0 before it first ran)

    def record(self, seconds: float, before: Dict[str, float], after: Dict[str, float]) -> None:
        """One step of ``seconds``, the timers' cumulative seconds before and after it."""
        n = len(self.steps)
        self.steps.append(seconds)
        for k, v in after.items():
            col = self.phases.get(k)
            if col is None:
                col = self.phases[k] = array("d", bytes(8 * n))
            col.append(v - before.get(k, 0.0))
        for col in self.phases.values():
            if len(col) == n:                   # a timer that did not appear in this step's totals
                col.append(0.0)

    def steady(self) -> List[int]:
        """Indices of the steady-state steps (see the module docstring)."""
        n = len(self.steps)
        first = min(max(3, n // 10), max(0, n - 1))
        idx = np.arange(first, n)
        if len(idx) < 4:
            return idx.tolist()
        t = np.frombuffer(self.steps)[idx]
        lo, hi = np.percentile(t, [25, 75])
        keep = idx[(t >= lo) & (t <= hi)]
        return keep.tolist() if len(keep) else idx.tolist()

    def summary(self) -> Dict[str, object]:
        """``step_ms``, ``components_ms`` (adding up to it), ``steps`` used."""
        keep = self.steady()
        if not keep:
            return {}
        keep_ix = np.asarray(keep)
        ms = lambda k: 1e3 * float(np.frombuffer(self.phases[k])[keep_ix].mean()) if k in self.phases else 0.0  # noqa: E731
        step = 1e3 * float(np.frombuffer(self.steps)[keep_ix].mean())
        bwd, out_bwd = ms("embedding_bwd"), ms("output_dist_bwd")
        comps = {
            "embedding_fwd": ms("lookup"),
            "embedding_bwd": bwd,
            "input_dist": ms("input_dist"),
            "output_dist": ms("output_dist") + out_bwd,
            "dense": ms("dense_fwd") + ms("optimizer") + max(0.0, ms("backward") - bwd - out_bwd),
            "data": ms("data"),
        }
        comps["other"] = step - sum(comps.values())
        return {"step_ms": round(step, 4), "components_ms": {k: round(v, 4) for k, v in comps.items()},
                "steps": len(keep), "median_step_ms": round(1e3 * float(np.median(np.frombuffer(self.steps)[keep_ix])), 4)}
