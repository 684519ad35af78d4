"""tools/bench_embedding.py end to end on its --quick workload: the gather probe reads the
batches' own rows (its table holds every table's rows: 4 x 20k rows of 256 B is not a whole
number of huge pages) beside Neo, and every forward is reported as a fraction of it and of the
same probe timed alone."""

from __future__ import annotations

import json

import pytest
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
        alone = fwd["probe"]["probe_alone_lookups_per_s"]   # the best setting again, its calls back to back
        assert alone > 0 and fwd["probe"]["fraction_of_probe_alone"] == limit / alone
        for name in ("neo", "neo-noval"):
            r = fwd[name]
            assert r["probe_lookups_per_s"] == limit and r["fraction_of_probe"] == r["lookups_per_s"] / limit
            assert r["probe_alone_lookups_per_s"] == alone
            assert r["fraction_of_probe_alone"] == r["lookups_per_s"] / alone
            assert r["row_bytes"] == row_bytes
            assert r["fraction_of_probe_same_state"] is None   # no peer to run between them
        for r in fwd.values():   # the lines each forward keeps in flight, from the run's one latency
            assert r["latency_ns"] == fwd["probe"]["latency_ns"] > 0
            assert r["lines_in_flight"] == pytest.approx(r["lookups_per_s"] * row_bytes // 64 * r["latency_ns"] * 1e-9)
        fwd_bwd = [r for r in records if r["dtype"] == dtype and r["phase"] == "fwd_bwd"]
        assert {r["backend"] for r in fwd_bwd} == {"neo", "neo-noval"}
        assert all(r["fraction_of_probe_alone"] is None for r in fwd_bwd)   # forward lookups only


def _run_with_peers(tmp_path, *flags: str):
    """A small run with FBGEMM and PyTorch, one thread, one iteration: (the tool, its records)."""
    bench = load_tool("bench_embedding.py")
    if load_tool("bench_common.py").peer_version("fbgemm_gpu") is None:
        pytest.skip("fbgemm_gpu not importable")
    out = tmp_path / "emb.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--tables", "2", "--rows", "1000", "--batch", "32", "--threads", "1",
                           "--iters", "1", *flags, "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    return bench, json.loads(out.read_text())


def test_the_probe_setting_is_chosen_each_call_after_a_system_and_only_it_joins_the_rotation(tmp_path):
    """choose_probe times the settings each right after the selector's forward and picks the
    fastest; a run's probe record names that setting and holds every setting's median, and the
    rotation's probe reading is that setting's."""
    import time

    bench = load_tool("bench_embedding.py")
    calls = []

    def runner(name, sleep_s):
        def fwd(b):
            calls.append(name)
            time.sleep(sleep_s)
        return bench.Runner(name, fwd, None)

    probes = [runner("probe@0,0", 0.004), runner("probe@32,256", 0.0), runner("probe@64,512", 0.002)]
    args = type("Args", (), {"warmup": 1, "iters": 3})()
    best, ms = bench.choose_probe(probes, runner("fbgemm", 0.0), list(range(4)), args)
    assert best == "probe@32,256" and set(ms) == {p.name for p in probes}
    assert calls[0::2] == ["fbgemm"] * 12 and sorted(calls[1::2]) == sorted([p.name for p in probes] * 4)

    out = tmp_path / "emb.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--no-torch", "--no-fbgemm", "--dtypes", "fp32", "--threads", "1",
                           "--iters", "2", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    probe = next(r for r in json.loads(out.read_text()) if r["backend"] == "probe")
    settings = probe["probe_settings_ms"]
    assert len(settings) == 6 and probe["probe_prefetch"] == min(settings, key=settings.get).split("@")[1]


def test_each_neo_runner_has_tables_of_its_own_from_the_same_start():
    """neo, neo-noval and a tuned runner: the same forward at first; a step of one leaves the
    others' tables as they were."""
    import argparse

    systems = load_tool("embedding_systems.py")
    args = argparse.Namespace(tables=2, rows=50, dim=8, batch=4, pooling_factor=3, skew=0.0, weighted=False,
                              learnable_weights=False)
    batch = systems.make_batches(args, 1)[0]
    runners, weights = systems.neo_runners(args, tunings=({"fwd_prefetch": 4},))
    assert [r.name for r in runners] == ["neo", "neo-noval", "neo@fwd_prefetch=4"]
    before = [r.fwd(batch) for r in runners]
    assert all(torch.equal(before[0], o) for o in before[1:])
    runners[0].fwd_bwd(batch)
    assert not torch.equal(runners[0].fwd(batch), before[0])
    assert all(torch.equal(r.fwd(batch), before[0]) for r in runners[1:])


def test_time_phase_with_a_peer_puts_the_peer_before_every_call():
    """The same-state pass: peer, r0, peer, r1, ... every round, a fresh batch per call, only the
    runners' calls timed (warm-up rounds untimed)."""
    bench = load_tool("bench_embedding.py")
    calls = []

    def runner(name):
        return bench.Runner(name, lambda b: calls.append((name, b)), None)

    res = bench.time_phase([runner("probe@32,256"), runner("neo")], "fwd", list(range(5)), warmup=1, iters=2,
                           peer=runner("peer"))
    assert set(res) == {"probe@32,256", "neo"} and all(ms >= 0 for ms in res.values())
    assert [n for n, _ in calls] == ["peer", "probe@32,256", "peer", "neo"] * 3
    assert [b for _, b in calls] == [i % 5 for i in range(12)]


def test_same_state_fraction_with_a_peer(tmp_path):
    """With FBGEMM present, Neo's forward and the probe are also timed each right after FBGEMM's
    forward, and FBGEMM's and the probe each right after Neo's: Neo's and FBGEMM's records say
    both speeds and their ratio."""
    _, records = _run_with_peers(tmp_path, "--no-torch")
    for dtype in ("fp32", "fp16"):
        fwd = {r["backend"]: r for r in records if r["dtype"] == dtype and r["phase"] == "fwd"}
        for name in ("neo", "fbgemm"):
            r = fwd[name]
            assert r["same_state_lookups_per_s"] > 0 and r["probe_same_state_lookups_per_s"] > 0
            assert r["fraction_of_probe_same_state"] == pytest.approx(
                r["same_state_lookups_per_s"] / r["probe_same_state_lookups_per_s"])
        assert all(fwd[k]["fraction_of_probe_same_state"] is None for k in ("probe", "neo-noval"))
        assert all(r["fraction_of_probe_same_state"] is None for r in records if r["phase"] == "fwd_bwd")


def test_rows_of_partial_lines_run_without_a_probe(tmp_path):
    """D 24 (96-byte fp32 rows, not whole cache lines): no probe, so no fractions of it, and the
    run still times every system, FBGEMM included (the same-state pass needs the probe)."""
    _, records = _run_with_peers(tmp_path, "--no-torch", "--dtypes", "fp32", "--dim", "24")
    fwd = {r["backend"]: r for r in records if r["phase"] == "fwd"}
    assert set(fwd) == {"neo", "neo-noval", "fbgemm"} and all(r["ms"] > 0 for r in fwd.values())
    for r in fwd.values():
        assert r["fraction_of_probe"] is None and r["fraction_of_probe_same_state"] is None
        assert r["latency_ns"] is None and r["lines_in_flight"] is None


def test_peers_start_from_neos_tables_and_a_left_out_peer_is_a_note(tmp_path):
    """FBGEMM and PyTorch compute Neo's forward (same tables copied in): max_abs_diff_vs_neo in
    every record; PyTorch, absent from the fp16 table, is a note record there."""
    bench, records = _run_with_peers(tmp_path)
    notes = [r for r in records if r.get("note")]
    assert [(r["backend"], r["dtype"]) for r in notes] == [("torch", "fp16")] and notes[0]["machine"]
    for r in records:
        if r["backend"] in ("fbgemm", "torch"):
            tol = bench.FORWARD_TOLERANCE[r["dtype"]]
            assert r.get("note") or r["max_abs_diff_vs_neo"] is not None and r["max_abs_diff_vs_neo"] < tol


@pytest.mark.parametrize("flag", ["--weighted", "--learnable-weights"])
def test_weighted_and_learnable_weights_in_every_system(tmp_path, flag):
    """--weighted: weighted batches in every system; --learnable-weights: their weights also
    require grad in fwd_bwd, and every system's gradient of them is checked against Neo's before
    timing (max_abs_weight_grad_diff_vs_neo)."""
    _, records = _run_with_peers(tmp_path, "--dtypes", "fp32", flag)
    timed = {(r["backend"], r["phase"]) for r in records}
    assert {("neo", "fwd_bwd"), ("fbgemm", "fwd_bwd"), ("torch", "fwd_bwd")} <= timed
    learn = flag == "--learnable-weights"
    for r in records:
        assert r["weighted"] is True and r["learnable_weights"] is learn
        assert r["max_abs_diff_vs_neo"] is None or r["max_abs_diff_vs_neo"] < 1e-4
        if r["backend"] in ("neo", "neo-noval", "fbgemm", "torch"):   # every system, on tables of its own
            d = r["max_abs_weight_grad_diff_vs_neo"]
            assert (d is not None and d < 1e-4) if learn else d is None


def test_weight_grad_check_refuses_a_backend_that_does_other_work():
    bench = load_tool("bench_embedding.py")
    g = torch.ones(10)
    runners = [bench.Runner("neo", None, lambda b: g), bench.Runner("other", None, lambda b: g * 1.01)]
    with pytest.raises(RuntimeError, match="other"):
        bench.weight_grad_diffs(runners, None, "fp32")


def test_forward_check_refuses_a_backend_that_does_other_work():
    bench = load_tool("bench_embedding.py")
    out = torch.ones(4, 8)
    runners = [bench.Runner("neo", lambda b: out, None), bench.Runner("other", lambda b: out * 1.01, None)]
    with pytest.raises(RuntimeError, match="other"):
        bench.forward_diffs(runners, None, "fp16")
    assert bench.forward_diffs(runners[:1] + [bench.Runner("same", lambda b: out + 1e-4, None)], None, "fp16") \
        == {"neo": 0.0, "same": pytest.approx(1e-4, rel=1e-2)}


def test_the_cuda_section_on_cpu_tensors_compares_and_reports_every_dtype():
    """run_cuda (the GPU section) on CPU tensors, the Triton kernels interpreted: a subprocess,
    since TRITON_INTERPRET must be set before triton decorates the kernels. Triton against
    PyTorch in fp32 (same output), Triton alone in fp16, each record with its bandwidth share."""
    import os
    import subprocess
    import sys

    code = """
import argparse, json, sys
sys.path.insert(0, "tools")
import bench_embedding as be
args = argparse.Namespace(tables=3, rows=400, dim=8, batch=16, pooling_factor=3, skew=0.0, iters=1, warmup=0,
                          dtypes=["fp32", "fp16"], no_torch=False, weighted=False,
                          learnable_weights=False)
print(json.dumps(be.run_cuda(args, {"cpu_model": "test"}, device="cpu")))
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    records = json.loads(p.stdout.strip().splitlines()[-1])
    got = {(r["backend"], r["dtype"], r["phase"]) for r in records}
    assert got == {("triton", "fp32", "fwd"), ("triton", "fp32", "fwd_bwd"), ("torch", "fp32", "fwd"),
                   ("torch", "fp32", "fwd_bwd"), ("triton", "fp16", "fwd"), ("triton", "fp16", "fwd_bwd")}
    for r in records:
        assert r["max_abs_diff_vs_triton"] <= 1e-5 and r["device"] == "cpu" and r["machine"] == {"cpu_model": "test"}
        assert r["bandwidth_share_of_copy"] == pytest.approx(r["bandwidth_gbs"] / r["copy_gbs"])
        assert r["triton"] and "gpu" in r


def test_cuda_only_without_cuda_is_a_usage_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --cuda-only runs")
    with pytest.raises(SystemExit) as e:
        load_tool("bench_embedding.py").main(["--cuda-only"])
    assert e.value.code == 2
    assert "--cuda-only: this torch sees no CUDA device" in capsys.readouterr().err


def test_neo_tuning_times_neo_under_other_settings_and_restores_the_defaults(tmp_path):
    """--neo-tuning adds Neo's module under other kernel settings (neo._C._set_tuning) to the
    rotation: its forward checked against Neo's, both phases timed; this CPU's defaults are in
    force again after the run. A setting that neo._C does not have is refused."""
    from neo import _C

    bench = load_tool("bench_embedding.py")
    defaults = _C._tuning()
    out = tmp_path / "emb.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--no-torch", "--no-fbgemm", "--dtypes", "fp32", "--threads", "1",
                           "--iters", "1", "--neo-tuning", "bwd_lookahead=3,sort_prefetch=1", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert _C._tuning() == defaults
    tuned = [r for r in json.loads(out.read_text()) if r["backend"] == "neo@bwd_lookahead=3,sort_prefetch=1"]
    assert sorted(r["phase"] for r in tuned) == ["fwd", "fwd_bwd"]
    assert all(r["max_abs_diff_vs_neo"] == 0.0 for r in tuned)   # the same module's forward: the same bits
    for bad in ("bogus=1", "bwd_lookahead", "bwd_lookahead=-2"):
        with pytest.raises(SystemExit):
            bench.main(["--quick", "--neo-tuning", bad])


def test_skewed_ids_are_zipf_ranks_scattered_over_the_rows():
    """--skew S: each table's ids are Zipf(S) ranks (the synthetic data's zipf_ranks) put through
    a bijection of the rows, so the counts per row are the ranks' counts, the hottest row not
    the table's first."""
    import argparse

    import numpy as np

    from data_pipeline.locality import zipf_ranks

    systems = load_tool("embedding_systems.py")
    ids = systems.skewed_ids(200_000, 10_000, 1.05, np.random.default_rng(5))
    ranks = zipf_ranks(np.random.default_rng(5), 200_000, 10_000, 1.05)
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and int(ids.max()) < 10_000
    counts = torch.bincount(ids, minlength=10_000)
    assert sorted(counts.tolist()) == sorted(np.bincount(ranks, minlength=10_000).tolist())
    assert int(counts.argmax()) != 0 and int(counts.max()) > 200 * int(counts.median())

    args = argparse.Namespace(tables=3, rows=1000, dim=8, batch=64, pooling_factor=5, weighted=False, skew=1.05)
    for b in systems.make_batches(args, 2):
        b.check()
        per_table = torch.split(b.values, b.lengths.view(3, 64).sum(1).tolist())
        assert all(int(v.max()) < 1000 for v in per_table)
        assert max(int(torch.bincount(v).max()) for v in per_table) > 10   # hot rows repeat within a table


def test_a_skewed_run_says_its_skew(tmp_path):
    out = tmp_path / "emb.json"
    threads = torch.get_num_threads()
    try:
        assert load_tool("bench_embedding.py").main(["--quick", "--no-torch", "--no-fbgemm", "--dtypes", "fp32",
                                                     "--threads", "1", "--iters", "1", "--skew", "1.05",
                                                     "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    records = json.loads(out.read_text())
    assert {r["backend"] for r in records} == {"probe", "neo", "neo-noval"}
    assert all(r["skew"] == 1.05 for r in records)
