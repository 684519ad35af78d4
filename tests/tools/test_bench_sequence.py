"""tools/bench_sequence.py on a tiny workload: every system runs both phases at the same work, the
ratios are the peer's time over Neo's, and FBGEMM (where installed) ends with Neo's tables."""

from __future__ import annotations

import json

import torch

from tests.tools import load_tool

bench = load_tool("bench_sequence.py")


def test_a_tiny_run_records_every_system_and_phase(tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "seq.json"
    try:
        assert bench.main(["--tables", "2", "--rows", "100", "--dim", "8", "--batch", "4", "--seq-len", "3",
                           "--iters", "2", "--warmup", "1", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    records = json.load(open(out))["records"]
    systems = {r["system"] for r in records}
    assert {"neo", "torch"} <= systems
    for r in records:
        assert r["phase"] in ("fwd", "fwd_bwd") and r["ms"] > 0 and r["machine"]["cpu_model"]
        if r["system"] != "neo":
            neo = next(x for x in records if x["system"] == "neo" and x["phase"] == r["phase"])
            assert r["vs_neo"] == round(r["ms"] / neo["ms"], 3)
        if r["system"] == "fbgemm" and r["phase"] == "fwd_bwd":
            assert r["max_abs_diff_vs_neo"] < 1e-5          # the same row-wise Adagrad, step for step
    assert "other / neo" in capsys.readouterr().out
