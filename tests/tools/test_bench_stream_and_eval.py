"""tools/bench_stream.py and tools/bench_eval.py on tiny inputs: they record what they measured,
and the evaluation's metrics do not depend on its batch size."""

from __future__ import annotations

import json
import os

import torch

from tests.tools import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stream_records_read_and_copy_bandwidth(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "stream.json"
    try:
        assert load_tool("bench_stream.py").main(["--sizes", "1,2", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    records = json.load(open(out))["records"]
    assert [r["mib"] for r in records] == [1, 2]
    assert all(r["read_gb_s"] > 0 and r["copy_gb_s"] > 0 and r["machine"]["cpu_model"] for r in records)


def test_eval_times_each_batch_size_with_the_same_metrics(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "eval.json"
    try:
        status = load_tool("bench_eval.py").main([
            "--config", os.path.join(ROOT, "configs", "train_tiny.yaml"), "--sizes", "0,300", "--reps", "1",
            "--run-dir", str(tmp_path / "run"), "--json", str(out),
            f"data.synthetic.cache_dir={tmp_path / 'cache'}", "train.batch_size=64"])
    finally:
        torch.set_num_threads(threads)
    records = json.load(open(out))["records"]
    assert status == 0 and [r["eval_batch_size"] for r in records] == [64, 300]
    assert records[0]["samples"] == records[1]["samples"] > 0 and all(r["auc_matches_first"] for r in records)
