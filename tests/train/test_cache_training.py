"""Training with cached tables equals training with every row in memory, bit for bit.

The oracle is the same run with the same plan and ``placement: device``: losses, every table's
weights and optimizer state must be equal (fp32, same backend), with evictions in every step,
pipelined (batch i+1 prefetched under step i, lookahead window) and plain, in one process and
at world size 2 with a mixed plan (a row-wise and a column-wise table cached), and across a
checkpoint (dirty rows are written back before it is saved)."""

from __future__ import annotations

import json
import os

import torch

from tests.multiprocess import run_multiprocess
from tests.train.test_trainer import MIXED, train_and_collect

BIGGER = ["tables.0.num_rows=3000", "tables.1.num_rows=2000", "train.batch_size=64"]
"""user and item large enough that their caches evict every step."""
CACHED = ["tables.0.placement=cached", "tables.0.cache_rows=400", "tables.0.cache_policy=lookahead",
          "tables.0.cache_lookahead=3", "tables.1.placement=cached", "tables.1.cache_rows=300",
          "tables.1.cache_policy=lru"]


def assert_identical(a, b):
    assert a["losses"] == b["losses"]
    for name in a["weights"]:
        assert torch.equal(a["weights"][name], b["weights"][name]), f"table {name}: weights differ"
        for k in a["states"][name]:
            assert torch.equal(a["states"][name][k], b["states"][name][k]), f"table {name}: state {k} differs"
    for k in a["dense"]:
        assert torch.equal(a["dense"][k], b["dense"][k]), k


def device_plan(plan, path):
    """``plan`` with every table on the device, written to ``path``: the same shards and ranks."""
    tables = {n: {k: v for k, v in t.items() if k in ("sharding_type", "shards")} | {"placement": "device"}
              for n, t in plan["tables"].items()}
    with open(path, "w") as f:
        json.dump(dict(plan, tables=tables), f)
    return f"sharding.plan_file={path}"


def cache_windows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "cache"]


def test_one_process_pipelined_and_plain(tmp_data):
    common = ["train.steps=24", "train.log_every=1"] + BIGGER
    device = run_multiprocess(train_and_collect, 1, tmp_data, common + ["tables.0.placement=device",
                                                                        "tables.1.placement=device"])[0]
    pipe = run_multiprocess(train_and_collect, 1, tmp_data, common + CACHED + [f"train.run_dir={tmp_data}/c1"])[0]
    windows = cache_windows(f"{tmp_data}/c1")
    plain = run_multiprocess(train_and_collect, 1, tmp_data, common + CACHED + ["train.pipelined=false"])[0]
    assert_identical(device, pipe)
    assert_identical(device, plain)
    # a window a step, then one of what followed (the final evaluation's lookups, the write-back)
    assert len(windows) == 25 and all(w["user"]["evictions"] > 0 and w["item"]["evictions"] > 0
                                      for w in windows[8:23])   # full caches (the last step prefetches nothing)
    assert windows[-1]["step"] == 24 and windows[-1]["user"]["batches"] > 0
    final = pipe["final"]["cache"]
    for table in ("user", "item"):                             # the windows add up to the totals
        for k in ("batches", "accesses", "hits", "misses", "evictions", "writebacks", "bytes_in", "bytes_out"):
            assert sum(w[table][k] for w in windows) == final[table][k], (table, k)
    assert final["user"]["accesses"] == final["user"]["hits"] + final["user"]["misses"]
    assert final["user"]["batches"] >= 24 and final["user"]["hidden_s"] >= 0
    # the end of training writes the dirty rows back whether or not a checkpoint does it (before,
    # without train.checkpoint_dir those were not counted: audit of 2026-11-30)
    saved = run_multiprocess(train_and_collect, 1, tmp_data, common + CACHED + [f"train.run_dir={tmp_data}/c2",
                                                                               f"train.checkpoint_dir={tmp_data}/c2ck"])[0]
    for table in ("user", "item"):
        assert final[table]["writebacks"] == saved["final"]["cache"][table]["writebacks"], table


def test_two_processes_mixed_plan(tmp_data):
    common = ["train.steps=20"] + BIGGER + MIXED
    cached = run_multiprocess(train_and_collect, 2, tmp_data, common + CACHED)
    same_plan = device_plan(cached[0]["plan"], f"{tmp_data}/device_plan.json")
    device = run_multiprocess(train_and_collect, 2, tmp_data, common + [same_plan])
    assert cached[0]["plan_types"] == ["column_wise", "data_parallel", "row_wise", "table_wise"]
    for a, b in zip(device, cached):
        assert_identical(a, b)
    stats = cached[0]["final"]["cache"]
    assert stats["user"]["evictions"] > 0 and stats["item"]["evictions"] > 0
    assert stats == cached[1]["final"]["cache"]          # summed over both ranks' shards


def test_checkpoint_resume_with_cached_tables(tmp_data):
    ck = f"{tmp_data}/cached-resume"
    common = BIGGER + MIXED + CACHED
    full = run_multiprocess(train_and_collect, 2, tmp_data, ["train.steps=30"] + common)
    run_multiprocess(train_and_collect, 2, tmp_data, ["train.steps=18", f"train.checkpoint_dir={ck}"] + common)
    rest = run_multiprocess(train_and_collect, 2, tmp_data, ["train.steps=30", f"train.checkpoint_dir={ck}"] + common)
    for f, b in zip(full, rest):
        assert b["losses"] == f["losses"][18:]
        for name in f["weights"]:
            assert torch.equal(b["weights"][name], f["weights"][name]), name
