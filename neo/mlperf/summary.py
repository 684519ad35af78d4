"""The score of a set of runs: MLPerf's olympic mean of the times to train, and ``summary.json``.

MLPerf Training scores a benchmark by its result runs (10 for DLRM-DCNv2): drop the fastest and
the slowest, average the rest. A run that did not reach the target (status ``aborted``) counts as
infinitely slow, so one such run is the one dropped as the slowest and two make the set fail.

Example: times 60, 50, 70, 55, 65 s -> drop 50 and 70 -> (60 + 55 + 65) / 3 = 60 s.

With fewer than 3 runs there is nothing to drop: the score is the plain mean (and says so in
``method``, with ``olympic: false``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["RunSummary", "Score", "olympic_mean", "summary_dict", "write_summary", "format_summary"]


@dataclass
class RunSummary:
    """One seed's run."""

    seed: int
    status: str
    """``success`` (reached the target) or ``aborted``."""
    time_to_train_s: float
    """run_start .. run_stop, seconds."""
    final_auc: float
    """AUROC of the last evaluation (the one that stopped the run)."""
    epoch_num: float
    """Fraction of the training set seen at run_stop."""
    evaluations: int
    samples_per_s: float
    """Training throughput of the run (evaluations excluded), global samples per second."""
    init_s: float
    """init_start .. init_stop, seconds."""
    result_file: str
    curve: List[Dict[str, Any]] = field(default_factory=list)
    """Every evaluation: step, samples, epoch_num, auc, seconds since run_start."""


@dataclass
class Score:
    value_s: Optional[float]
    """The score in seconds; None when too many runs did not reach the target."""
    olympic: bool
    """True when the fastest and slowest run were dropped."""
    method: str
    """How ``value_s`` was computed, in words."""


def olympic_mean(times_s: Sequence[float]) -> Score:
    """MLPerf's score of the times to train (``inf`` for a run that did not converge), see module doc."""
    times = sorted(float(t) for t in times_s)
    if not times:
        raise ValueError("olympic_mean: no runs")
    if len(times) < 3:
        kept, olympic = times, False
        method = f"plain mean of {len(times)} run(s): the olympic mean (drop fastest and slowest) needs >= 3 runs"
    else:
        kept, olympic = times[1:-1], True
        method = f"olympic mean: mean of {len(kept)} runs after dropping the fastest and the slowest of {len(times)}"
    if any(math.isinf(t) for t in kept):
        return Score(None, olympic, method + "; too many runs did not reach the target, no score")
    return Score(sum(kept) / len(kept), olympic, method)


def summary_dict(runs: Sequence[RunSummary], division: str, target_auc: float, config: str,
                 world_size: int, required_runs: int) -> Dict[str, Any]:
    times = [r.time_to_train_s if r.status == "success" else math.inf for r in runs]
    score = olympic_mean(times)
    return {
        "benchmark": "dlrm_dcnv2", "division": division, "config": config, "target_auc": target_auc,
        "world_size": world_size, "runs": [asdict(r) for r in runs],
        "converged": sum(r.status == "success" for r in runs),
        "score_s": None if score.value_s is None else round(score.value_s, 3),
        "olympic": score.olympic, "score_method": score.method,
        "required_runs": required_runs,
        "enough_runs": len(runs) >= required_runs,
    }


def write_summary(path: str, summary: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, path)


def format_summary(summary: Dict[str, Any]) -> str:
    """The console table of the runs and the score."""
    lines = [f"neo mlperf: {summary['benchmark']} ({summary['division']} division), target AUC "
             f"{summary['target_auc']}, {summary['world_size']} rank(s), config {summary['config']}",
             f"{'seed':>6s} {'status':>8s} {'time_to_train_s':>16s} {'final_auc':>10s} {'epochs':>8s} "
             f"{'evals':>6s} {'samples/s':>11s}"]
    for r in summary["runs"]:
        lines.append(f"{r['seed']:6d} {r['status']:>8s} {r['time_to_train_s']:16.3f} {r['final_auc']:10.5f} "
                     f"{r['epoch_num']:8.4f} {r['evaluations']:6d} {r['samples_per_s']:11.0f}")
    score = "none" if summary["score_s"] is None else f"{summary['score_s']:.3f} s"
    flag = "" if summary["olympic"] else "  [NOT an olympic mean]"
    lines.append(f"score: {score} ({summary['score_method']}){flag}")
    if not summary["enough_runs"]:
        lines.append(f"note: {len(summary['runs'])} run(s); an MLPerf result needs {summary['required_runs']}")
    return "\n".join(lines)
