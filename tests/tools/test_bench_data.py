"""tools/bench_data.py times the multi-hot gather's numpy baseline and Neo's C++ copy interleaved:
each repetition runs both (bench_common.call_orders: neither right after itself), not all of one's
repetitions and then the other's."""

from __future__ import annotations

import data_pipeline.reader as reader
from tests.tools import load_tool


def test_multi_hot_take_times_the_two_gathers_interleaved(monkeypatch):
    bench = load_tool("bench_data.py")
    seq = []
    numpy_take, neo_take = bench._take_numpy, reader.take_from_parts

    def rec(name, fn):
        def wrapped(parts, ix):
            seq.append(name)
            return fn(parts, ix)
        return wrapped

    monkeypatch.setattr(bench, "_take_numpy", rec("numpy", numpy_take))
    monkeypatch.setattr(reader, "take_from_parts", rec("neo", neo_take))
    reps = 5
    out = bench.bench_multi_hot_take(16, reps=reps, part_rows=64)
    assert seq[:2] == ["numpy", "neo"]                    # the check that both give the same batch
    timed = seq[2:]
    assert len(timed) == 2 * (reps + 3)
    blocks = [timed[i:i + 2] for i in range(0, len(timed), 2)]
    assert all(sorted(b) == ["neo", "numpy"] for b in blocks)           # each once per repetition
    assert all(a != b for a, b in zip(timed, timed[1:]))                 # neither right after itself
    assert [r["name"] for r in out] == ["multi-hot take: numpy (previous loader)", "multi-hot take: neo._C.jagged_take"]
    assert out[0]["ms_per_batch"] > 0 and out[1]["speedup_vs_numpy"] > 0
