"""tools/bench_planner.py's skipping section: the picks it reports as different are the ones that
differ, its counts reconcile, and its records reach the JSON."""

from __future__ import annotations

import json

from neo.planner import Topology, plan_tables
from neo.planner.workloads import production_like_tables
from tests.tools import load_tool

bench = load_tool("bench_planner.py")


def test_the_skipping_section_reports_each_seed_whose_pick_differs(tmp_path):
    out = tmp_path / "planner.json"
    assert bench.main(["--quick", "--no-torchrec", "--rival-seeds", "0", "--skip-seeds", "2",
                       "--skip-seed-start", "251", "--json", str(out)]) == 0
    families = json.loads(out.read_text())["skipping"]["families"]
    assert [(f["world_size"], f["tables"]) for f in families] == [(8, 20), (16, 60)]
    for f in families:
        assert f["compared"] == 2 and f["seeds"] == [251, 252] and f["differ"] == len(f["cases"])
        assert f["seconds_skipping"] > 0 and f["seconds_every"] > 0
        reported = {c["seed"]: c for c in f["cases"]}
        topo = Topology.uniform(f["world_size"], 8, hbm_gib=24)
        for seed in (251, 252):                       # the oracle: both searches run here again
            tables = production_like_tables(f["tables"], seed=seed, max_rows=f["max_rows"])
            fast, every = plan_tables(tables, topo), plan_tables(tables, topo, alternatives=1)
            assert (seed in reported) == (fast.tables != every.tables), seed
            if seed in reported:
                ratio = fast.summary["max_ms"] / every.summary["max_ms"]
                assert reported[seed]["max_ratio"] == round(ratio, 6)
                assert f["worst_max_ratio"] >= round(ratio, 6)
