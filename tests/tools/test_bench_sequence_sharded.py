"""tools/bench_sequence_sharded.py on a tiny workload: Neo runs every sharding type it offers,
TorchRec table_wise and column_wise (the other types a note each), and after the same steps
both hold the same tables (the same SGD on the same ids and gradients)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.tools import TOOLS, load_tool

bench = load_tool("bench_sequence_sharded.py")


def test_a_tiny_run_records_both_systems(tmp_path):
    out = tmp_path / "seq_sharded.json"
    # as a script: its ranks are spawned processes, which import it by its own name
    run = subprocess.run([sys.executable, os.path.join(TOOLS, "bench_sequence_sharded.py"), "--quick", "--tables", "3",
                          "--seq-len", "4", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    records = json.load(open(out))
    neo = {r["sharding_type"] for r in records if r["system"] == "neo"}
    assert neo == set(bench.NEO_TYPES)
    # TorchRec is in the dev requirements: its comparison must run, not become a note
    assert {r["sharding_type"] for r in records if r["system"] == "torchrec" and r["step_ms"] is not None} \
        == set(bench.TORCHREC_TYPES), [r.get("note") for r in records if r["step_ms"] is None]
    # the types TorchRec does not run are a note each, not a silent gap
    notes = {r["sharding_type"]: r["note"] for r in records if r["step_ms"] is None}
    assert set(notes) == set(bench.NEO_TYPES) - set(bench.TORCHREC_TYPES)
    assert all(n.startswith("left out") for n in notes.values()), notes
    for r in records:
        assert r["machine"]["cpu_model"] and r["machine"]["cpu_flags"] and r["world_size"] == 2
        if r["step_ms"] is None:
            assert r["system"] == "torchrec"
            continue
        assert r["step_ms"] > 0 and r["forward_ms"] > 0 and r["backward_ms"] > 0
        if r["system"] == "torchrec":
            assert r["sharding_type"] in bench.TORCHREC_TYPES
            assert r["max_abs_diff_vs_neo"] < 1e-5
    assert "step_ms" in run.stdout and "left out" in run.stdout
