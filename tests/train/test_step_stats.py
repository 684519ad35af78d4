"""StepStats' steady-state summary against a plain recomputation from the recorded steps."""

from __future__ import annotations

import numpy as np
import pytest

from neo.train.step_stats import StepStats


def test_summary_equals_plain_means_over_the_steady_steps():
    rng = np.random.default_rng(0)
    stats, totals, rows = StepStats(), {}, []
    for i in range(60):
        names = ["lookup", "embedding_bwd", "backward", "data"] + (["input_dist"] if i >= 20 else [])  # one timer appears late
        before = dict(totals)
        phase = {k: float(rng.uniform(1e-4, 2e-3)) for k in names}
        for k, v in phase.items():
            totals[k] = totals.get(k, 0.0) + v
        seconds = sum(phase.values()) + float(rng.uniform(0, 1e-3))
        stats.record(seconds, before, dict(totals))
        rows.append((seconds, phase))

    keep = stats.steady()
    t = np.array([s for s, _ in rows])
    idx = np.arange(6, 60)                                     # first max(3, 10%) steps left out
    lo, hi = np.percentile(t[idx], [25, 75])
    assert keep == idx[(t[idx] >= lo) & (t[idx] <= hi)].tolist()

    mean = lambda k: 1e3 * np.mean([rows[i][1].get(k, 0.0) for i in keep])  # noqa: E731
    out = stats.summary()
    c = out["components_ms"]
    assert out["step_ms"] == pytest.approx(1e3 * np.mean(t[keep]), abs=1e-3)
    assert c["embedding_fwd"] == pytest.approx(mean("lookup"), abs=1e-3)
    assert c["input_dist"] == pytest.approx(mean("input_dist"), abs=1e-3)
    assert c["data"] == pytest.approx(mean("data"), abs=1e-3)
    assert c["dense"] == pytest.approx(max(0.0, mean("backward") - mean("embedding_bwd")), abs=1e-3)
    assert sum(c.values()) == pytest.approx(out["step_ms"], abs=1e-2)
    assert len(stats.phases["input_dist"]) == len(stats.steps) == 60  # 8 bytes per step per timer, zero before it ran
