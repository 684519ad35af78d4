"""tools/pipeline_prediction.py, the model side of tools/bench_pipeline.py: the runtime's cost per
schedule action is recovered from a null model's measured time (pure functions, no training)."""

from __future__ import annotations

import pytest

from tests.tools import load_tool

bench = load_tool("pipeline_prediction.py")


def _rows(n: int, fwd: float, bwd: float):
    return [{"name": f"l{k}", "fwd_ms": fwd, "bwd_ms": bwd, "activation_bytes": 4096, "param_bytes": 1000}
            for k in range(n)]


def _chunks(split, fwd: float, bwd: float):
    """Chunk profiles (profile_chunks' fields) of layers of ``fwd`` / ``bwd`` ms each; zero bubble's
    passes as torch runs them (the first chunk: no input pass)."""
    out = []
    for k, (a, z) in enumerate(split):
        n = z - a + 1
        out.append({"fwd_ms": n * fwd, "bwd_ms": n * bwd, "input_grad_ms": 0.0 if k == 0 else n * bwd,
                    "weight_grad_ms": n * bwd})
    return out


@pytest.mark.parametrize("schedule,v,W,cores", [("1f1b", 1, 2, 2), ("gpipe", 1, 4, 2), ("zero_bubble", 1, 2, 0),
                                                ("interleaved_1f1b", 2, 2, 2), ("chimera", 1, 4, 2)])
def test_fit_op_ms_recovers_the_cost_of_an_action(schedule, v, W, cores):
    rows = _rows(8, 0.01, 0.02)
    chunks = W * v
    split = [[k * 8 // chunks, (k + 1) * 8 // chunks - 1] for k in range(chunks)]
    one_way = {4: 0.05, 4096: 0.06}
    truth = 0.3
    ch = _chunks(split, 0.01, 0.02)
    null_ms = bench.predict_pipeline(ch, rows, schedule, v, split, W, 8, 1.0, one_way, truth, cores, 1).pipeline_ms
    got = bench.fit_op_ms(ch, rows, schedule, v, split, W, 8, 1.0, one_way, null_ms, cores, 1)
    assert got == pytest.approx(truth, rel=1e-6)
    # a null model whose own arithmetic explains its time: no runtime cost
    floor = bench.predict_pipeline(ch, rows, schedule, v, split, W, 8, 1.0, one_way, 0.0, cores, 1).pipeline_ms
    assert bench.fit_op_ms(ch, rows, schedule, v, split, W, 8, 1.0, one_way, floor * 0.9, cores, 1) == 0.0


def test_allreduce_probe_gives_back_its_own_time():
    """The bandwidth read off a probe (bytes, ranks, ms) makes the model's ring AllReduce of those
    bytes over those ranks last the probe's time."""
    from neo.pipeline.perf_model import allreduce_ms

    for probe in [(12_000_000, 2, 11.5), (3_000_000, 4, 7.25)]:
        assert allreduce_ms(probe[0], probe[1], bench.allreduce_gbps(probe)) == pytest.approx(probe[2])


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("zero_bubble", 1), ("interleaved_1f1b", 2), ("chimera", 1)])
def test_runtime_cpu_per_action_is_the_null_runs_cpu_beyond_its_compute(schedule, v):
    """With shared cores the runtime's cost is CPU: (null CPU - the null chunks' compute) / actions."""
    W, M = 4, 8
    split = [[k, k] for k in range(W * v)]
    ch = _chunks(split, 0.01, 0.02)
    compute, actions = bench.compute_ms(ch, schedule, v, W, M)
    per_micro = sum(c["fwd_ms"] + (c["input_grad_ms"] + c["weight_grad_ms"] if schedule == "zero_bubble"
                                   else c["bwd_ms"]) for c in ch)
    assert compute == pytest.approx(M * per_micro)
    assert actions == M * W * v * (3 if schedule == "zero_bubble" else 2)
    assert bench.runtime_cpu_ms(ch, schedule, v, W, M, compute + 0.7 * actions) == pytest.approx(0.7)
    assert bench.runtime_cpu_ms(ch, schedule, v, W, M, compute / 2) == 0.0
