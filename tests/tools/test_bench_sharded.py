"""tools/bench_sharded.py on its tiny workload (--quick, 2 ranks, table-wise): both systems start
from the same tables and their first pooled outputs agree; every record carries the machine and
the memory latency measured around the runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tests.tools import TOOLS, load_tool


def test_a_quick_run_compares_the_same_tables_and_records_the_memory_latency(tmp_path):
    out = tmp_path / "sharded.json"
    with_torchrec = load_tool("bench_common.py").peer_version("torchrec", "fbgemm_gpu") is not None
    argv = ["--quick", "--world-sizes", "2", "--types", "table_wise", "--json", str(out)]
    # as a script: its ranks are spawned processes, which import it by its own name
    run = subprocess.run([sys.executable, os.path.join(TOOLS, "bench_sharded.py"), *argv,
                          *([] if with_torchrec else ["--no-torchrec"])], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    records = json.loads(out.read_text())
    by_system = {r["system"]: r for r in records}
    assert set(by_system) == ({"neo", "torchrec"} if with_torchrec else {"neo"}), by_system
    for r in records:
        assert r["world_size"] == 2 and r["sharding_type"] == "table_wise"
        assert math.isfinite(r["step_ms"]) and r["step_ms"] > 0
        lat = r["machine"]["memory_latency_ns"]
        # a chase over more than the last-level cache: DRAM's tens of ns at least, never a cache hit's few
        assert set(lat) == {"before", "after"} and all(20 < v < 10_000 for v in lat.values()), lat
    assert "ns a dependent read before the runs" in run.stdout
    if with_torchrec:
        # the same fp32 sums of the same rows: equal up to summation order (pooled values of order 0.1)
        diff = by_system["torchrec"]["max_abs_diff_vs_neo"]
        assert diff is not None and 0.0 <= diff < 1e-5, diff
        assert "TorchRec / neo =" in run.stdout
