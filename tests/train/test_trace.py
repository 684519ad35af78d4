"""The timeline (``train.trace``): a 2-rank run writes one valid Chrome / Perfetto trace whose spans
cover every phase on every rank, nest properly on each lane, show the next batch's input
distribution in flight under the current step's compute, and leave the main thread little idle
time; tracing changes no number, and off it allocates nothing."""

from __future__ import annotations

import json
import os

import pytest

from neo.train.trace import (TraceRecorder, idle_gaps, input_dist_overlap, lane_violations, load_trace, spans,
                             to_chrome)
from tests.multiprocess import run_multiprocess
from tests.train.test_cache_training import BIGGER, CACHED
from tests.train.test_trainer import MIXED, tiny_config

STEP_PHASES = {"step", "data", "input_dist", "lookup", "output_dist", "dense_fwd", "backward", "embedding_bwd",
               "output_dist_bwd", "optimizer"}
"""Main-lane phases of every traced step."""


def _train(rank, world_size, tmp, overrides):
    from neo.train.trainer import Trainer

    tr = Trainer(tiny_config(tmp, *overrides), log=lambda *a, **k: None)
    allocated = tr.trace is not None or tr.timers.trace is not None
    final = tr.fit()
    dense = {k: v.clone() for k, v in tr.model.state_dict().items() if not k.startswith("embedding.")}
    return {"losses": tr.losses, "final": final, "dense": dense, "allocated": allocated}


@pytest.fixture(scope="module")
def traced(tmp_data):
    path = os.path.join(tmp_data, "trace", "run.json")
    common = ["train.steps=24", "train.eval_batches=4"] + MIXED
    on = run_multiprocess(_train, 2, tmp_data, common + [f"train.trace={path}",
                                                         f"train.checkpoint_dir={tmp_data}/ckpt"])
    off = run_multiprocess(_train, 2, tmp_data, common + [f"train.checkpoint_dir={tmp_data}/ckpt_off"])
    return path, on, off


def test_trace_is_valid_and_covers_every_phase_on_every_rank(traced):
    path, on, _ = traced
    assert on[0]["final"]["trace"] == path and on[1]["final"]["trace"] is None   # rank 0 writes one file
    with open(path) as f:
        trace = json.load(f)                                                     # valid JSON
    events = trace["traceEvents"]
    for e in events:
        if e["ph"] == "X":
            assert {"name", "ts", "dur", "pid", "tid", "args"} <= set(e) and e["dur"] >= 0
    assert trace["otherData"]["ranks"] == 2
    for rank in (0, 1):
        main = {e["name"] for e in spans(trace, rank, "main")}
        assert STEP_PHASES | {"evaluate", "checkpoint", "metrics"} <= main, STEP_PHASES - main
        lanes = {e["args"]["lane"].split(" ")[0] for e in spans(trace, rank)}
        assert {"main", "input_dist", "grad_sync", "loader", "reader"} <= lanes
        assert {e["name"] for e in spans(trace, rank, "grad_sync")} == {"grad_sync"}
        assert len(spans(trace, rank, "main", ["step"])) == 24
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == rank
                 and e["name"] == "thread_name"}
        assert {"main", "input_dist", "grad_sync", "loader"} <= names
    assert lane_violations(trace) == []


def test_input_dist_overlaps_the_previous_step_and_the_host_stays_busy(traced):
    trace = load_trace(traced[0])
    for rank in (0, 1):
        rows = [r for r in input_dist_overlap(trace, rank) if r["step"] >= 1]
        # batch i+1's input distribution is launched before step i's compute and completed after it
        assert len(rows) >= 20
        assert sum(r["overlap_us"] > 0 for r in rows) >= 0.9 * len(rows), rows
        gaps = idle_gaps(trace, rank)
        assert gaps["window_us"] > 0 and gaps["idle_share"] < 0.35, gaps        # generous: a loaded 2-core CI host


def test_tracing_changes_no_number_and_off_allocates_nothing(traced):
    _, on, off = traced
    for a, b in zip(on, off):
        assert a["losses"] == b["losses"]
        for k in a["dense"]:
            assert a["dense"][k].equal(b["dense"][k]), k
        assert a["allocated"] and not b["allocated"]
        assert "trace" not in b["final"]


def test_cached_tables_trace_their_prefetch(tmp_data):
    path = os.path.join(tmp_data, "trace_cache.json")
    run_multiprocess(_train, 1, tmp_data, ["train.steps=8", "train.eval_batches=2", f"train.trace={path}"]
                     + BIGGER + CACHED)
    trace = load_trace(path)
    cache = spans(trace, 0, "cache")
    assert cache and {e["name"] for e in cache} == {"cache_prefetch"}
    assert lane_violations(trace) == []


def test_recorder_is_bounded_and_packs_lanes_in_flight():
    rec = TraceRecorder(rank=3, max_steps=2)
    for step in range(5):
        rec.begin_step(step)
        with rec.span("data", "main"):
            pass
    rec.end_step()
    with rec.span("evaluate", "main"):                      # kept after max_steps
        pass
    names = [e["name"] for e in rec.events()]
    assert names.count("data") == 2 and names.count("step") == 2 and "evaluate" in names
    assert rec.dropped == 6
    a = {"name": "grad_sync", "ph": "X", "ts": 0.0, "dur": 10.0, "pid": 3, "args": {"lane": "grad_sync", "step": 0}}
    b = dict(a, ts=5.0, args=dict(a["args"]))
    trace = to_chrome([[a, b]])
    assert {e["args"]["lane"] for e in spans(trace, 3)} == {"grad_sync", "grad_sync 2"}
    assert lane_violations(trace) == []
    g = idle_gaps({"traceEvents": [dict(a, name="x", args={"lane": "main", "step": 0}),
                                   dict(a, name="y", ts=15.0, args={"lane": "main", "step": 0})]}, 3)
    assert g["window_us"] == 25.0 and g["idle_us"] == 5.0 and g["gaps"] == [(10.0, 5.0)]
