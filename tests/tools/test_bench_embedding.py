"""tools/bench_embedding.py end to end on its --quick workload: the gather probe reads the
batches' own rows (its table holds every table's rows: 4 x 20k rows of 256 B is not a whole
number of huge pages) beside Neo, and every forward is reported as a fraction of it."""

from __future__ import annotations

import json

import torch

from tests.tools import load_tool


def test_quick_run_reports_each_forward_against_the_probe(tmp_path):
    out = tmp_path / "emb.json"
    threads = torch.get_num_threads()
    try:
        assert load_tool("bench_embedding.py").main(["--quick", "--no-torch", "--no-fbgemm", "--threads", "1",
                                                     "--iters", "1", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    records = json.loads(out.read_text())
    for dtype, row_bytes in (("fp32", 256), ("fp16", 128)):
        fwd = {r["backend"]: r for r in records if r["dtype"] == dtype and r["phase"] == "fwd"}
        assert set(fwd) == {"probe", "neo", "neo-noval"}
        limit = fwd["probe"]["lookups_per_s"]
        assert fwd["probe"]["fraction_of_probe"] == 1.0 and fwd["probe"]["probe_prefetch"]
        for name in ("neo", "neo-noval"):
            r = fwd[name]
            assert r["probe_lookups_per_s"] == limit and r["fraction_of_probe"] == r["lookups_per_s"] / limit
            assert r["row_bytes"] == row_bytes
        assert {r["backend"] for r in records if r["dtype"] == dtype and r["phase"] == "fwd_bwd"} == {"neo", "neo-noval"}
