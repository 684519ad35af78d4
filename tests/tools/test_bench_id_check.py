"""tools/bench_id_check.py: every Neo system's counts (and int32 ids) are checked against torch's
before timing, and the records carry what docs/benchmarks.md quotes."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tools import load_tool


def test_records_of_a_small_run(tmp_path):
    bench = load_tool("bench_id_check.py")
    out = tmp_path / "id.json"
    assert bench.main(["--batch", "8", "--bad", "0.05", "--iters", "2", "--warmup", "0", "--threads", "1,2",
                       "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    from neo import _C

    names = {"torch", "torch+int32"} | {f"neo-{i}{s}" for i in _C.cpu_isa_supported() for s in ("", "+int32")}
    assert {r["system"] for r in records} == names
    assert {r["threads"] for r in records} == {1, 2}
    ids = 8 * sum(bench.MULTI_HOT)
    assert all(r["ids"] == ids and r["bad_ids"] == int(0.05 * ids) and r["ms"] > 0 for r in records)
    assert all(r["vs_torch"] == 1.0 for r in records if r["system"].startswith("torch"))


def test_a_wrong_count_stops_the_run():
    bench = load_tool("bench_id_check.py")
    values, offsets, rows = bench.make_batch(4, 100, 0.1)
    calls = bench.systems(values, offsets, 4, rows, ["baseline"])
    isa, peer, fn = calls["neo-baseline"]
    calls["neo-baseline"] = (isa, peer, lambda: fn() + torch.nn.functional.one_hot(torch.tensor(3), rows.numel()))
    with pytest.raises(AssertionError, match="neo-baseline differs from torch"):
        bench.check(calls)
    calls = bench.systems(values, offsets, 4, rows, ["baseline"])
    isa, peer, fn = calls["neo-baseline+int32"]
    calls["neo-baseline+int32"] = (isa, peer, lambda: (fn()[0], fn()[1].clamp(0)))      # -1 lost
    with pytest.raises(AssertionError, match=r"neo-baseline\+int32 differs from torch\+int32"):
        bench.check(calls)
