"""tools/bench_gather_probe.py: the limit is the best of every schedule run, each timed call on
ids of its own after a flush, --wide adds the far prefetch's variants, --sorted reads the same
ids in address order beside it, and the latency chain is one cycle through every row."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tools import load_tool

bench = load_tool("bench_gather_probe.py")


def test_the_table_holds_at_least_what_is_asked_in_whole_huge_pages():
    """bench_embedding sizes the probe's table to hold its tables' rows: never fewer bytes."""
    for gib in (8 * 1_000_000 * 256 / (1 << 30), 0.004, 1e-9):
        n = bench.table_bytes(gib)
        assert n >= gib * (1 << 30) and n % bench.HUGE_PAGE == 0 and n - gib * (1 << 30) < bench.HUGE_PAGE
    assert bench.make_table(0.004).numel() == bench.table_bytes(0.004) == 3 * bench.HUGE_PAGE


def test_wide_adds_each_far_variant_at_each_far_distance():
    plain, wide = bench.schedules(False), bench.schedules(True)
    assert [s[0] for s in plain] == [f"{n},{f}" for n, f in bench.DISTANCES]
    extra = {s[0]: s[1:] for s in wide[len(plain):]}
    fars = [(n, f) for n, f in bench.DISTANCES if f]
    assert len(extra) == len(fars) * len(bench.FAR_VARIANTS)
    for n, f in fars:
        assert extra[f"{n},{f},t2"] == (n, f, 2, 1)
        assert extra[f"{n},{f},nta"] == (n, f, 0, 1)
        assert extra[f"{n},{f},every2"] == (n, f, 1, 2)


def test_the_flush_is_twice_the_last_level_cache():
    assert bench.flush_mib_default({"L1d": "48K", "L2": "2048K", "L3": "307200K"}) == 600
    assert bench.flush_mib_default({"L2": "1M"}) == 2
    assert bench.flush_mib_default({"L2": "512K"}) == 1
    assert bench.flush_mib_default({}) == bench.flush_mib_default(None) == 512
    assert bench.evictor(3).buf.numel() * 4 == 3 << 20                # calibration's CacheEvictor, 3 MiB
    assert bench.evictor(0)() is None                                   # 0: nothing to run


def test_each_timed_call_reads_ids_of_its_own_after_a_flush(monkeypatch):
    """Rows read again by the next call would come from cache (a 300 MiB last-level cache holds
    1M rows of 256 B): every timed call gets a fresh id set, the same one for every schedule,
    and a flush right before it."""
    from neo import _C

    events = []
    real = _C.gather_probe
    def recorded(table, row_bytes, ids, *args):
        events.append(("call", ids))
        return real(table, row_bytes, ids, *args)

    monkeypatch.setattr(_C, "gather_probe", recorded)

    def recorder():
        events.append(("flush", None))

    table = bench.make_table(0.004)
    rec = bench.probe(table, 256, 1, lookups=500, reps=3, flush=recorder, latency_ns=100.0)
    per_schedule = len(bench.schedules(False))
    assert len(events) == per_schedule * (1 + 2 * 3)            # a warm-up, then (flush, call) x reps
    sets = []
    for k in range(per_schedule):
        ev = events[7 * k: 7 * (k + 1)]
        assert ev[0][0] == "call" and [e[0] for e in ev[1:]] == ["flush", "call"] * 3
        sets.append([e[1] for e in ev if e[0] == "call"])
    first = sets[0]
    assert all(not torch.equal(first[i], first[j]) for i in range(4) for j in range(i))   # a fresh set per call
    assert all(all(a is b for a, b in zip(first, other)) for other in sets[1:])          # the same for each schedule
    assert rec["lines_in_flight"] == pytest.approx(rec["lookups_per_s"] * 4 * 100e-9)


def test_the_latency_chain_is_one_cycle_through_every_row():
    """memory_latency_ns links the table's 256-byte rows into one random cycle: from any row,
    following the links visits every row once before coming back."""
    from neo import _C

    table = bench.make_table(0.004)
    ns = bench.memory_latency_ns(table, bench.evictor(0), steps=1000)
    assert ns > 0
    rows = table.numel() // 256
    links = table.view(torch.int64).view(rows, 32)[:, 0]
    assert torch.equal(links.sort().values, torch.arange(rows))     # a permutation
    seen, r = set(), 0
    for _ in range(rows):
        seen.add(r)
        r = int(links[r])
    assert r == 0 and len(seen) == rows                              # one cycle
    assert _C.chase_probe(table, 256, 0, rows) == 0


def test_the_limit_is_the_best_schedule_and_sorted_ids_are_reported_beside_it(tmp_path, capsys):
    out = tmp_path / "probe.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--dims", "64", "--threads", "1", "--table-gib", "0.004", "--lookups", "3000",
                           "--reps", "1", "--wide", "--sorted", "--flush-mib", "1", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    (rec,) = json.loads(out.read_text())
    by = rec["lookups_per_s_by_prefetch"]
    assert set(by) == {s[0] for s in bench.schedules(True)}
    assert rec["best_prefetch"] == max(by, key=by.get) and rec["lookups_per_s"] == by[rec["best_prefetch"]]
    assert rec["gb_per_s"] == rec["lookups_per_s"] * 256 / 1e9 and rec["row_bytes"] == 256 and rec["dim"] == 64
    by_sorted = rec["lookups_per_s_sorted_by_prefetch"]
    assert set(by_sorted) == set(by)
    assert rec["lookups_per_s_sorted"] == by_sorted[rec["best_prefetch_sorted"]] == max(by_sorted.values())
    assert rec["table_gib"] == 6 / 1024   # 0.004 GiB rounded up to whole 2 MiB huge pages
    assert rec["flush_mib"] == 1 and rec["latency_ns"] > 0
    assert rec["lines_in_flight"] == pytest.approx(rec["lookups_per_s"] * 4 * rec["latency_ns"] * 1e-9)
    printed = capsys.readouterr().out
    assert "sorted / random" in printed and "every schedule" in printed and "memory latency" in printed
