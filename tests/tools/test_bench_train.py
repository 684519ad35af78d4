"""tools/bench_train.py on a tiny workload: before timing, TorchRec's DLRM starts from Neo's weights
(tables and MLPs) and one forward of each on the same batch must give the same logits; a TorchRec
model that is not Neo's stops the run."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from tests.tools import TOOLS, load_tool

TINY = ["--quick", "--tables", "4", "--rows", "100", "--dim", "8", "--batch", "32", "--workloads", "one-hot",
        "--neo-plans", "table_wise", "--steps", "2", "--warmup", "0"]


def _run(argv):
    if load_tool("bench_common.py").peer_version("torchrec", "fbgemm_gpu") is None:
        pytest.skip("torchrec / fbgemm_gpu not importable")
    # as a script: its ranks are spawned processes, which import it by its own name
    return subprocess.run([sys.executable, os.path.join(TOOLS, "bench_train.py"), *argv],
                          capture_output=True, text=True, timeout=300)


def test_torchrec_starts_from_neos_weights_and_computes_the_same_logits(tmp_path):
    out = tmp_path / "train.json"
    run = _run(TINY + ["--json", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    records = json.loads(out.read_text())
    by_system = {r["system"]: r for r in records}
    assert set(by_system) == {"neo", "torchrec"}
    assert by_system["neo"]["max_abs_diff_vs_neo"] is None
    diff = by_system["torchrec"]["max_abs_diff_vs_neo"]
    # logits of order 1: the same fp32 arithmetic in another order is ~1e-7 apart
    assert diff is not None and math.isfinite(diff) and 0.0 <= diff < 1e-5, diff
    assert "forward check: max |torchrec logit - neo (table_wise)|" in run.stdout
    # the memory latency around the runs, in every record: a chase over more than the last-level
    # cache, so DRAM's tens of ns at least, never a cache hit's few
    for r in records:
        lat = r["machine"]["memory_latency_ns"]
        assert set(lat) == {"before", "after"} and all(20 < v < 10_000 for v in lat.values()), lat
    assert "memory latency:" in run.stdout and "ns a dependent read before the runs" in run.stdout


def test_a_torchrec_model_that_is_not_neos_stops_the_run_before_timing(tmp_path):
    out = tmp_path / "train.json"
    run = _run(TINY + ["--test-perturb-torchrec", "0.01", "--json", str(out)])   # every logit + 0.01
    assert run.returncode != 0
    assert re.search(r"forward check: torchrec's logits differ from Neo's \(table_wise\) by 0\.01 ", run.stderr), \
        run.stderr[-3000:]
    assert not out.exists()


def test_position_weighted_features_are_the_same_model_in_both_systems(tmp_path):
    """``--position-weights``: Neo's PositionWeights (the collection's weight_table) and TorchRec's
    PositionWeightedModuleCollection in a sharded FeatureProcessedEmbeddingBagCollection, started
    from the same weights (not 1), give the same logits on multi-hot bags before timing."""
    out = tmp_path / "train.json"
    argv = [a if a != "one-hot" else "multi-hot" for a in TINY]
    run = _run(argv + ["--position-weights", "--json", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    records = json.loads(out.read_text())
    assert {r["system"] for r in records} == {"neo", "torchrec"} and all(r["position_weights"] for r in records)
    diff = next(r for r in records if r["system"] == "torchrec")["max_abs_diff_vs_neo"]
    assert diff is not None and math.isfinite(diff) and 0.0 <= diff < 1e-5, diff
