"""tools/bench_gather_probe.py: the limit is the best of every schedule run, --wide adds the far
prefetch's variants, and --sorted reads the same ids in address order beside it."""

from __future__ import annotations

import json

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


def test_the_limit_is_the_best_schedule_and_sorted_ids_are_reported_beside_it(tmp_path, capsys):
    out = tmp_path / "probe.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--dims", "64", "--threads", "1", "--table-gib", "0.004", "--lookups", "3000",
                           "--reps", "1", "--wide", "--sorted", "--json", str(out)]) == 0
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
    printed = capsys.readouterr().out
    assert "sorted / random" in printed and "every schedule" in printed
