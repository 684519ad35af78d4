"""The replayed pipeline step (neo/pipeline/simulate.py) against hand-computed steps, the papers'
closed forms (equal stages, a device per rank) and the independent event simulation of
tests/pipeline/test_perf_model.py (unequal stages); the orders against what each schedule must run."""

import random
from collections import Counter

import pytest

from neo.pipeline.perf_model import allreduce_ms, predict
from neo.pipeline.simulate import (Action, ChunkCosts, best_replayed, chunk_costs_of, orders, predict_replayed,
                                   replay)
from tests.pipeline.test_perf_model import simulate


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1)])
@pytest.mark.parametrize("S,M", [(2, 4), (4, 8), (4, 12)])
def test_equal_chunks_give_the_closed_forms(schedule, v, S, M):
    """Equal chunks, no latency, a device each: the replay is the papers' step and bubble."""
    C = S * v
    costs = ChunkCosts([1.0 / v] * C, [2.0 / v] * C)
    got = replay(orders(schedule, S, M, v), costs)
    want = predict(schedule, [1.0] * S, [2.0] * S, M, virtual_stages=max(v, 2))
    assert got.pipeline_ms == pytest.approx(want.pipeline_ms)
    assert got.bubble_fraction == pytest.approx(want.bubble_fraction)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_unequal_chunks_match_the_event_simulation(schedule):
    rng = random.Random(7)
    for _ in range(20):
        S, M = rng.choice([2, 3, 4, 5]), rng.choice([1, 2, 5, 8])
        f = [rng.uniform(0.5, 3) for _ in range(S)]
        b = [rng.uniform(0.5, 5) for _ in range(S)]
        got = replay(orders(schedule, S, M), ChunkCosts(f, b))
        makespan, idle = simulate(f, b, M, schedule)
        assert got.pipeline_ms == pytest.approx(makespan)
        assert got.bubble_fraction == pytest.approx(idle)


def test_latency_hand_computed():
    """GPipe, 2 ranks, 2 micro-batches, forward 1, backward 2, 0.5 ms each way between them:
    rank 1's forwards run 1.5-2.5, 2.5-3.5 and its backwards 3.5-7.5; rank 0's backwards start
    when the gradient arrives, 6-8 and 8-10."""
    got = replay(orders("gpipe", 2, 2), ChunkCosts([1.0, 1.0], [2.0, 2.0]), comm_ms=[0.5])
    assert got.pipeline_ms == pytest.approx(10.0)
    assert got.busy_ms == pytest.approx([6.0, 6.0])
    assert got.bubble_fraction == pytest.approx(1 - 12 / 20)


def test_shared_core_hand_computed():
    """The same pipeline on one core: rank 0's first forward alone (0-1), then rank 0's second
    and rank 1's first forward at half speed each (1-3), rank 1's second forward alone (3-4) and
    first backward (4-6), then rank 1's second and rank 0's first backward at half speed (6-10),
    rank 0's last backward alone (10-12): the core never idles, 12 ms, as the work adds up to.
    With a core each the same pipeline takes (M + S - 1)(f + b) = 9 ms."""
    costs = ChunkCosts([1.0, 1.0], [2.0, 2.0])
    assert replay(orders("gpipe", 2, 2), costs).pipeline_ms == pytest.approx(9.0)
    got = replay(orders("gpipe", 2, 2), costs, cores=1)
    assert got.pipeline_ms == pytest.approx(12.0)
    assert got.busy_ms == pytest.approx([1 + 2 + 4 + 2, 2 + 1 + 2 + 4])     # stretched where shared
    assert replay(orders("gpipe", 2, 2), costs, cores=2).pipeline_ms == pytest.approx(9.0)
    assert replay(orders("gpipe", 2, 2), costs, cores=1, threads_per_rank=2).pipeline_ms == pytest.approx(24.0)


def test_runtime_cost_lengthens_each_action_but_is_not_compute():
    costs = ChunkCosts([1.0, 1.0], [2.0, 2.0])
    got = replay(orders("gpipe", 2, 2), costs, op_ms=0.5)
    assert got.pipeline_ms == pytest.approx(3 * 4.0)                      # (M + S - 1)(f + b + 2 op)
    assert got.busy_ms == pytest.approx([6.0, 6.0])
    assert got.bubble_fraction == pytest.approx(1 - 12 / 24)


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1),
                                        ("zero_bubble", 2), ("chimera", 1)])
@pytest.mark.parametrize("S", [2, 4])
def test_orders_run_every_action_once_in_a_feasible_order(schedule, v, S):
    M = 8
    ords = orders(schedule, S, M, v)
    assert len(ords) == S
    C = S * v
    pipes = (0, 1) if schedule == "chimera" else (0,)
    kinds = ("F", "I", "W") if schedule == "zero_bubble" else ("F", "B")
    micro = M // 2 if schedule == "chimera" else M
    every = Counter(a for rank in ords for a in rank)
    assert every == Counter(Action(k, c, m, p) for k in kinds for c in range(C) for m in range(micro) for p in pipes)
    for r, acts in enumerate(ords):
        seen = set()
        for a in acts:
            if schedule == "chimera":                          # stage s of the down pipeline, S-1-s of the up one
                assert (a.chunk if a.pipe == 0 else S - 1 - a.chunk) == r
            else:
                assert a.chunk % S == r                         # chunk k on rank k mod S
            if a.kind != "F":
                assert Action("F", a.chunk, a.micro, a.pipe) in seen
            if a.kind == "W":
                assert Action("I", a.chunk, a.micro, a.pipe) in seen
            seen.add(a)
    rep = replay(ords, ChunkCosts([1.0] * C, [2.0] * C), comm_ms=[0.1] * (C - 1), cores=1)
    assert rep.pipeline_ms >= M * C * 3.0 - 1e-9                  # one core: at least all the work
    assert 0.0 <= rep.bubble_fraction < 1.0


def test_deadlocked_orders_are_an_error():
    ords = [[Action("B", 0, 0), Action("F", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        replay(ords, ChunkCosts([1.0, 1.0], [1.0, 1.0]))


def test_chunk_costs_are_checked():
    with pytest.raises(ValueError, match=r"bwd_ms: needs 2 values"):
        chunk_costs_of([1.0, 1.0], [1.0])
    with pytest.raises(ValueError, match=r"weight_grad_ms\[1\]"):
        chunk_costs_of([1.0, 1.0], [1.0, 1.0], [0.0, 0.5], [1.0, float("nan")])
    c = chunk_costs_of([1.0, 1.0], [2.0, 4.0])
    assert [c.of("I", k) for k in (0, 1)] == [0.0, 2.0] and [c.of("W", k) for k in (0, 1)] == [2.0, 2.0]


def test_zero_bubble_replays_the_measured_passes():
    """Zero bubble's actions cost the profiled input and weight passes, not the full backward."""
    S, M = 2, 4
    cheap = ChunkCosts([1.0, 1.0], [2.0, 2.0], [0.0, 1.0], [2.0, 1.0])
    dear = ChunkCosts([1.0, 1.0], [2.0, 2.0], [0.0, 2.0], [2.0, 2.0])
    a = replay(orders("zero_bubble", S, M), cheap).pipeline_ms
    b = replay(orders("zero_bubble", S, M), dear).pipeline_ms
    assert b > a
    assert replay(orders("1f1b", S, M), dear).pipeline_ms == replay(orders("1f1b", S, M), cheap).pipeline_ms


def test_predict_replayed_adds_the_gradient_sync_and_best_breaks_ties_simply():
    costs = ChunkCosts([1.0] * 4, [2.0] * 4)
    p = predict_replayed("1f1b", costs, 8, 4, chunk_param_bytes=[4e6] * 4, bandwidth_gbps=2.0, replicas=2)
    assert p.sync_ms == pytest.approx(allreduce_ms(4e6, 2, 2.0))
    assert p.step_ms == pytest.approx(p.pipeline_ms + p.sync_ms)
    c = predict_replayed("chimera", costs, 8, 4, chunk_param_bytes=[4e6] * 4, bandwidth_gbps=2.0)
    assert c.sync_ms == pytest.approx(allreduce_ms(8e6, 2, 2.0))            # the mirrored pair's two stages
    name, pred = best_replayed(["gpipe", "1f1b"], costs, 8, 4)                 # equal: the simpler, 1F1B
    assert name == "1f1b" and pred.step_ms == pytest.approx(33.0)
    name, _ = best_replayed(["1f1b", "zero_bubble", "chimera"], costs, 8, 4)
    assert name in ("zero_bubble", "chimera")
    with pytest.raises(ValueError, match="no candidate"):
        best_replayed([], costs, 8, 4)


def test_cost_fields_are_the_chunk_profiles():
    """The simulator reads profile_chunks' rows by these names (chunk_costs)."""
    from dataclasses import fields

    from neo.pipeline.profile import ChunkProfile
    from neo.pipeline.simulate import COST_FIELDS, chunk_costs

    assert tuple(f.name for f in fields(ChunkProfile)) == COST_FIELDS
    c = chunk_costs([ChunkProfile(1.0, 2.0, 0.0, 2.0), ChunkProfile(1.5, 3.0, 1.0, 2.5)])
    assert (c.fwd_ms, c.bwd_ms, c.input_grad_ms, c.weight_grad_ms) == ([1.0, 1.5], [2.0, 3.0], [0.0, 1.0], [2.0, 2.5])
