"""``neo cache-report`` and its simulator: Belady is the exact optimum, the policies are the
training cache's own decisions, and the command's output and errors."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from neo.cli import main
from neo.commands.cache_report import config_trace
from neo.embedding.cache.simulate import batch_rows, simulate, simulate_belady, simulate_set_associative

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def brute_force_min_misses(seq, capacity):
    """The fewest misses of any eviction sequence (exhaustive search; tiny inputs only)."""
    best = {frozenset(): 0}
    for row in seq:
        nxt = {}
        for cache, misses in best.items():
            if row in cache:
                options = [(cache, misses)]
            elif len(cache) < capacity:
                options = [(cache | {row}, misses + 1)]
            else:
                options = [((cache - {v}) | {row}, misses + 1) for v in cache]
            for c, m in options:
                if m < nxt.get(c, 1 << 30):
                    nxt[c] = m
        best = nxt
    return min(best.values())


def test_belady_is_the_optimum():
    rng = np.random.default_rng(1)
    for _ in range(25):
        trace = rng.integers(0, 7, size=18)
        batches = batch_rows(trace, 3, 7)
        seq = list(itertools.chain.from_iterable(b.tolist() for b in batches))
        for cap in (2, 3, 4):
            r = simulate_belady(batches, cap)
            assert r.accesses - r.hits == brute_force_min_misses(seq, cap)


def test_every_policy_is_at_most_belady_and_lru_is_plain_lru():
    rng = np.random.default_rng(2)
    trace = rng.zipf(1.3, 6000) % 500
    batches = batch_rows(trace, 100, 500)
    best = simulate_belady(batches, 150).hits
    for p in ("lru", "lfu", "lookahead"):
        assert simulate(batches, 500, 150, p).hits <= best
    # plain LRU at batch granularity, written out independently
    resident, last, hits = set(), {}, 0
    for t, rows in enumerate(batches):
        need = [r for r in rows.tolist() if r not in resident]
        hits += len(rows) - len(need)
        for r in rows.tolist():
            last[r] = t
        for r in need:
            if len(resident) >= 150:
                victim = min((x for x in resident if last[x] < t), key=lambda x: (last[x], x))
                resident.remove(victim)
            resident.add(r)
    assert simulate(batches, 500, 150, "lru").hits == hits


def test_set_associative_cache_has_conflict_misses():
    rng = np.random.default_rng(3)
    trace = rng.zipf(1.2, 20000) % 4000
    batches = batch_rows(trace, 200, 4000)
    r = simulate_set_associative(batches, 4000, 400, "lru", ways=4)
    full = simulate(batches, 4000, 400, "lru")
    assert r.accesses == full.accesses and r.conflict_misses > 0
    assert r.conflict_misses >= (r.accesses - r.hits) - (full.accesses - full.hits)   # misses it alone has


def test_command_prints_one_json_line_per_capacity_and_policy(tmp_path, capsys):
    trace = np.random.default_rng(4).zipf(1.1, 40_000) % 20_000
    path = tmp_path / "trace.npy"
    np.save(path, trace.astype(np.int64))
    rc = main(["cache-report", str(path), "--batch-size", "1000", "--num-rows", "20000", "--capacity", "1500,3000",
               "--json"])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["capacity"], r["policy"]) for r in rows] == [(k, p) for k in (1500, 3000)
                                                            for p in ("lru", "lfu", "lookahead", "belady")]
    for r in rows:
        assert set(r) >= {"capacity", "policy", "accesses", "hits", "hit_rate"}
        assert r["hit_rate"] == pytest.approx(r["hits"] / r["accesses"])
    best = {r["capacity"]: r["hits"] for r in rows if r["policy"] == "belady"}
    assert all(r["hits"] <= best[r["capacity"]] for r in rows)
    rc = main(["cache-report", str(path), "--batch-size", "1000", "--num-rows", "20000", "--capacity", "3000",
               "--policies", "lru,lfu", "--ways", "32", "--json"])
    assert rc == 0
    assert all(json.loads(x)["ways"] == 32 and "conflict_misses" in json.loads(x)
               for x in capsys.readouterr().out.splitlines())


def test_command_errors_name_the_problem(tmp_path, capsys):
    path = tmp_path / "t.npy"
    np.save(path, np.array([1, 2, 3, 50], dtype=np.int64))
    cases = [
        ([str(tmp_path / "missing.npy"), "--batch-size", "2", "--num-rows", "60"], "does not exist"),
        ([str(path), "--batch-size", "2", "--num-rows", "10", "--capacity", "3"], "position 3: id 50 is outside"),
        ([str(path), "--batch-size", "4", "--num-rows", "60", "--capacity", "2"], "below the 4 distinct rows"),
        ([str(path), "--batch-size", "2", "--num-rows", "60", "--capacity", "4", "--policies", "fifo"], "fifo"),
        ([str(path), "--num-rows", "60"], "needs --batch-size and --num-rows"),
        # (audit of 2026-11-30) the window the training cache holds; an index too large for memory
        ([str(path), "--batch-size", "2", "--num-rows", "60", "--lookahead", "63"], "--lookahead 63: at most 62"),
        ([str(path), "--batch-size", "2", "--num-rows", str(10 ** 15)], "does not fit in memory"),
    ]
    for args, msg in cases:
        assert main(["cache-report"] + args) == 2
        assert msg in capsys.readouterr().err
    for flag, value, msg in (("--batch-size", "-5", "must be > 0, got -5"), ("--ways", "0", "must be > 0, got 0"),
                             ("--lookahead", "-3", "must be >= 0, got -3"), ("--num-rows", "x", "'x' is not an integer")):
        args = [str(path), "--batch-size", "2", "--num-rows", "60", "--capacity", "4", flag, value]
        with pytest.raises(SystemExit) as e:
            main(["cache-report"] + args)
        assert e.value.code == 2 and f"argument {flag}: {msg}" in capsys.readouterr().err


def test_pipelined_capacity_is_what_two_consecutive_batches_need(tmp_path, capsys):
    """--pipelined takes a capacity as small as the largest union of two consecutive batches (what
    the simulation and the training cache need), not twice the largest batch (audit of 2026-11-30)."""
    path = tmp_path / "t.npy"
    np.save(path, np.array([1, 2, 3, 4, 3, 4, 5, 6, 5, 6, 7, 8], dtype=np.int64))   # batches of 4, unions of 6
    assert main(["cache-report", str(path), "--batch-size", "4", "--num-rows", "10", "--capacity", "6",
                 "--pipelined", "--policies", "lru", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["capacity"] == 6
    assert main(["cache-report", str(path), "--batch-size", "4", "--num-rows", "10", "--capacity", "5",
                 "--pipelined", "--policies", "lru"]) == 2
    assert "below the 6 distinct rows two consecutive batches of this trace need" in capsys.readouterr().err


def test_config_mode_traces_the_configs_data(tmp_path, capsys):
    cfg = os.path.join(ROOT, "configs", "train_tiny.yaml")
    rc = main(["cache-report", cfg, "--table", "user", "--batches", "6", "--capacity", "300",
               f"data.synthetic.cache_dir={tmp_path}", "--json"])
    assert rc == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {r["policy"] for r in rows} == {"lru", "lfu", "lookahead", "belady"}
    assert all(0 < r["accesses"] <= 6 * 128 for r in rows)
    assert main(["cache-report", cfg, "--table", "nope", "--batches", "2", f"data.synthetic.cache_dir={tmp_path}"]) == 2
    assert "no table 'nope'" in capsys.readouterr().err


def _lookahead_written_out(batches, capacity, window):
    """The lookahead policy, one batch at a time, written independently of CacheIndex: victims
    among rows the current batch does not need, those no batch of the next ``window`` needs first
    (fewest past requests, then least recently used, then lowest row), then the row needed
    farthest ahead (same order among equals)."""
    resident, count, last, hits = set(), {}, {}, 0
    for t, rows in enumerate(batches):
        rows = rows.tolist()
        for r in rows:
            count[r] = count.get(r, 0) + 1
        need = [r for r in rows if r not in resident]
        hits += len(rows) - len(need)
        future = [set(b.tolist()) for b in batches[t + 1:t + 1 + window]]

        def key(x):
            d = next((i for i, f in enumerate(future) if x in f), None)
            return (0 if d is None else len(future) + 1 - (d + 1), count[x], last[x], x)
        free = capacity - len(resident)
        victims = sorted((x for x in resident if x not in set(rows)), key=key)[:max(0, len(need) - free)]
        resident.difference_update(victims)
        resident.update(need)
        for r in rows:
            last[r] = t
    return hits


def test_lookahead_equals_its_written_out_rule_with_a_window_past_32_batches():
    # 80 batches of 20 ids of 600 (reuse distance ~30 batches): a 45-batch window uses bits 32..44.
    # The trace is the first of a few seeds on which those far batches change the victims at 200
    # rows (the written-out rule's hits differ between windows of 45 and 32), so that a window kept
    # in 32 bits fails; at the default seeds the first (876 hits against 874), not at every
    # --seed-shift (at 211 the two tied)
    for seed in range(5, 25):
        batches = batch_rows(np.random.default_rng(seed).integers(0, 600, 80 * 20), 20, 600)
        want = _lookahead_written_out(batches, 200, 45)
        if want != _lookahead_written_out(batches, 200, 32):
            break
    else:
        pytest.fail("no trace of 20 on which batches 33..45 ahead change the lookahead's hits")
    for cap in (60, 200):
        assert simulate(batches, 600, cap, "lookahead", lookahead=45).hits == _lookahead_written_out(batches, cap, 45)
    assert simulate(batches, 600, 200, "lookahead", lookahead=32).hits == _lookahead_written_out(batches, 200, 32) != want


def test_set_associative_cache_holds_exactly_the_capacity():
    # 200 rows filling every set to its share: with 3 ways, ceil(200 / 3) = 67 sets (66 of 3 rows, 1 of 2),
    # so cycling over them hits every access after the first pass (the old 66 sets held only 198 rows)
    capacity, ways = 200, 3
    sets = -(-capacity // ways)
    share = [capacity // sets + (s < capacity % sets) for s in range(sets)]
    rows, r = [], 0
    while len(rows) < capacity:
        s = (r * 0x9E3779B1) % sets
        if share[s]:
            share[s] -= 1
            rows.append(r)
        r += 1
    trace = np.array(rows * 4, dtype=np.int64)
    batches = batch_rows(trace, 20, r)
    res = simulate_set_associative(batches, r, capacity, "lru", ways)
    assert res.hits == 3 * capacity and res.hits <= simulate_belady(batches, capacity).hits
    # never more rows than the capacity: at most Belady's hits, whatever the ways
    rng = np.random.default_rng(5)
    batches = batch_rows(rng.zipf(1.2, 20000) % 1000, 100, 1000)
    best = simulate_belady(batches, 200).hits
    for w in (1, 3, 7, 32, 199, 200):
        for p in ("lru", "lfu"):
            assert simulate_set_associative(batches, 1000, 200, p, w).hits <= best, (w, p)
    with pytest.raises(ValueError, match="ways 1000 exceeds the capacity 200"):
        simulate_set_associative(batches, 1000, 200, "lru", 1000)


def test_command_refuses_more_ways_than_capacity_an_empty_file_and_no_policies(tmp_path, capsys):
    trace = np.random.default_rng(6).zipf(1.2, 5000) % 1000
    path = tmp_path / "t.npy"
    np.save(path, trace.astype(np.int64))
    empty = tmp_path / "zero.npy"
    empty.write_bytes(b"")
    base = ["--batch-size", "100", "--num-rows", "1000"]
    cases = [
        ([str(path), *base, "--capacity", "200", "--ways", "1000"], "--ways 1000: more ways than the cache has rows"),
        ([str(path), *base, "--capacity", "300,150", "--ways", "200", "--policies", "belady"], "capacities [150]"),
        ([str(empty), *base], f"trace file {str(empty)!r} is empty (0 bytes)"),
        ([str(path), *base, "--capacity", "200", "--policies", ""], "--policies '': names no policy"),
        ([str(path), *base, "--capacity", "200", "--policies", " , "], "names no policy"),
    ]
    for args, msg in cases:
        assert main(["cache-report"] + args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("neo cache-report: error: ") and msg in err and err.count("\n") == 1, err
    assert main(["cache-report", str(path), *base, "--capacity", "200", "--ways", "200", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    best = {r["capacity"]: r["hits"] for r in rows if r["policy"] == "belady"}
    assert all(r["hits"] <= best[r["capacity"]] for r in rows)


def _min_hits_by_position(seq, capacity):
    """Belady's MIN written out (evict the resident row used again farthest ahead): a hit flag per
    access. Rows never used again are alike for the future, so the flags do not depend on ties."""
    resident, hits = set(), []
    for i, row in enumerate(seq):
        hits.append(row in resident)
        if row in resident:
            continue
        if len(resident) >= capacity:
            def next_use(r):
                return next((j for j in range(i + 1, len(seq)) if seq[j] == r), len(seq))
            resident.remove(max(sorted(resident), key=next_use))
        resident.add(row)
    return hits


@pytest.mark.parametrize("warmup", [0, 1, 3, 5])
def test_warmup_batches_are_simulated_but_not_counted(warmup):
    """With ``warmup`` W the caches take every batch as before and the counts are those of batches
    W and later: each policy's hits the sum of its per-batch hits (from the same simulation with
    nothing left out) over those batches, Belady's those of MIN's decisions (written out) at their
    positions, the set-associative cache's accesses the later batches' rows."""
    rng = np.random.default_rng(8)
    batches = batch_rows(rng.zipf(1.2, 12 * 40) % 300, 40, 300)
    later = sum(len(b) for b in batches[warmup:])
    for policy, lookahead in (("lru", 0), ("lfu", 0), ("lookahead", 3)):
        masks = []
        full = simulate(batches, 300, 60, policy, lookahead, pipelined=True, hit_masks=masks)
        warm = simulate(batches, 300, 60, policy, lookahead, pipelined=True, warmup=warmup)
        assert warm.accesses == later and warm.hits == sum(int(m.sum()) for m in masks[warmup:])
        assert warm.to_dict().get("warmup_batches") == (warmup or None)
        if warmup == 0:
            assert (warm.hits, warm.accesses) == (full.hits, full.accesses)
    seq = list(itertools.chain.from_iterable(b.tolist() for b in batches))
    start = sum(len(b) for b in batches[:warmup])
    for cap in (10, 40):
        flags = _min_hits_by_position(seq, cap)
        got = simulate_belady(batches, cap, warmup)
        assert (got.hits, got.accesses) == (sum(flags[start:]), len(seq) - start)
    sa = simulate_set_associative(batches, 300, 64, "lru", 8, warmup)
    assert sa.accesses == later and sa.conflict_misses <= sa.accesses - sa.hits


def test_command_warmup_batches(tmp_path, capsys):
    """--warmup-batches W: the JSON records count the batches after W (config mode reads W + N
    batches of the data, the same first ones as without it), and carry ``warmup_batches``; W at
    least the trace's batches is an error naming both."""
    cfg = os.path.join(ROOT, "configs", "train_tiny.yaml")
    base = ["cache-report", cfg, "--table", "user", "--capacity", "300", "--policies", "lru,belady",
            f"data.synthetic.cache_dir={tmp_path}", "--json"]
    assert main(base + ["--batches", "10"]) == 0
    ten = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert main(base + ["--batches", "6", "--warmup-batches", "4"]) == 0
    warm = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    trace, _ = config_trace(cfg, [f"data.synthetic.cache_dir={tmp_path}"], "user", 10, None)
    later = sum(len(np.unique(p)) for p in trace[4:])
    for a, b in zip(ten, warm):
        assert b["warmup_batches"] == 4 and "warmup_batches" not in a
        assert b["accesses"] == later < a["accesses"] and b["hits"] <= a["hits"]
    path = tmp_path / "t.npy"
    np.save(path, np.arange(12, dtype=np.int64))
    assert main(["cache-report", str(path), "--batch-size", "4", "--num-rows", "20", "--capacity", "8",
                 "--warmup-batches", "3"]) == 2
    assert "--warmup-batches 3: the trace has only 3 batches; none would be counted" in capsys.readouterr().err


def test_command_puts_the_planners_model_beside_each_policy(tmp_path, capsys):
    """``model_hit_rate``: the planner's model of the record's policy at the Zipf exponent fitted
    to the trace (recomputed here from the trace); after a long warm-up, the simulated lru is
    near its model (Che's approximation); belady and set-associative records carry none."""
    from data_pipeline.locality import zipf_ranks
    from neo.planner.cache_model import fit_skew, hit_rate

    rows, B = 50_000, 1000
    trace = zipf_ranks(np.random.default_rng(3), B * 160, rows, 1.05)
    path = tmp_path / "z.npy"
    np.save(path, trace.astype(np.int64))
    args = ["cache-report", str(path), "--batch-size", str(B), "--num-rows", str(rows), "--capacity", "2500",
            "--lookahead", "8", "--warmup-batches", "120"]
    assert main(args + ["--json"]) == 0
    recs = {r["policy"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    batches = batch_rows(trace, B, rows)
    skew = fit_skew(rows, float(B), float(np.mean([len(b) for b in batches])))
    assert 0.9 < skew < 1.2                                          # the trace's own exponent, 1.05
    for p in ("lru", "lfu", "lookahead"):
        assert recs[p]["model_skew"] == pytest.approx(skew)
        assert recs[p]["model_hit_rate"] == pytest.approx(hit_rate(0.05, rows, skew, float(B), policy=p, lookahead=8))
    assert "model_hit_rate" not in recs["belady"]
    assert recs["lru"]["model_hit_rate"] == pytest.approx(recs["lru"]["hit_rate"], abs=0.04)
    assert main(args + ["--policies", "lru", "--ways", "8", "--json"]) == 0
    assert "model_hit_rate" not in json.loads(capsys.readouterr().out)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "model" in out.splitlines()[1] and f"{recs['lru']['model_hit_rate']:.4f}" in out
