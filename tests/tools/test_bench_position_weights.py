"""tools/bench_position_weights.py on a tiny workload: every system runs, TorchRec's weights are
checked equal to Neo's before timing (where TorchRec is importable), and the records carry what
docs/benchmarks.md quotes."""

from __future__ import annotations

import json

import pytest

from tests.tools import load_tool


def test_records_of_a_small_run(tmp_path):
    bench = load_tool("bench_position_weights.py")
    out = tmp_path / "pw.json"
    assert bench.main(["--features", "3", "--batch", "16", "--bag", "3", "--rows", "50", "--iters", "2",
                       "--warmup", "0", "--threads", "1,2", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    names = {"lookup", "lookup+weights", "lookup+learnable", "lookup+position", "position", "position.table_index",
             "position.torch", "position.table_index.torch"}
    has_trec = load_tool("bench_common.py").peer_version("torchrec", "fbgemm_gpu") is not None
    assert {r["system"] for r in records} == names | ({"torchrec.position"} if has_trec else set())
    assert {r["threads"] for r in records} == {1, 2}
    assert all(r["ids"] == 3 * 16 * 3 and r["ms"] > 0 for r in records)
    pos = [r for r in records if r["system"] == "position"]
    assert all((r["vs_torchrec"] is not None) == has_trec for r in pos)


def test_torchrecs_weights_must_equal_neos():
    bench = load_tool("bench_position_weights.py")
    if load_tool("bench_common.py").peer_version("torchrec", "fbgemm_gpu") is None:
        pytest.skip("torchrec / fbgemm_gpu not importable")
    from torchrec.modules import feature_processor_

    real = feature_processor_.PositionWeightedModuleCollection

    class Off(real):                           # TorchRec's weights, one of them moved after the copy
        def forward(self, features):
            out = super().forward(features)
            out.weights()[0] += 1.0
            return out

    feature_processor_.PositionWeightedModuleCollection = Off
    try:
        with pytest.raises(AssertionError, match="TorchRec's position weights differ from Neo's by 1"):
            bench.main(["--features", "2", "--batch", "4", "--bag", "2", "--rows", "20", "--iters", "1", "--warmup", "0"])
    finally:
        feature_processor_.PositionWeightedModuleCollection = real


def test_the_modules_two_paths_must_agree(monkeypatch):
    """The torch operations' weights are checked equal to neo._C's before timing."""
    bench = load_tool("bench_position_weights.py")
    from neo.embedding import position_weights

    real = position_weights.PositionWeights.read

    def off(self, slots):                      # the torch path (no kernels) reads every weight 1 too high
        w = real(self, slots)
        return w + 1.0 if position_weights._kernels(slots) is None else w

    monkeypatch.setattr(position_weights.PositionWeights, "read", off)
    with pytest.raises(AssertionError, match="PositionWeights' two paths differ by 1"):
        bench.main(["--features", "2", "--batch", "4", "--bag", "2", "--rows", "20", "--iters", "1", "--warmup", "0"])
