"""This machine's random-row gather limit: the ceiling for any embedding forward lookup.

    python tools/bench_gather_probe.py                          # rows of 64, 128, 256 floats; 1 and 2 threads
    python tools/bench_gather_probe.py --isa avx2 --json bench_out/probe.json
    python tools/bench_gather_probe.py --dims 64 --threads 1 --wide --sorted   # more schedules; rows in address order

The probe (``neo._C.gather_probe``, csrc/kernels/probe.h) reads rows at uniformly random
positions of a table much larger than the last-level cache (2 GiB by default, ``--table-gib``:
keep it several times the last-level cache, which is 504 MiB on some of the Intel Xeon VMs
here) and sums them into registers: no bags, no output, ids split evenly over the threads, each
id's range checked in the gather's loop (a compare and a branch, as in Neo's forward; no pass
over the ids of its own). It runs with several software-prefetch distances (into L1 ``near``
ids ahead, into L2 ``far`` ids ahead) and the best is the limit. The table is backed by
transparent huge pages where the kernel allows (as Neo's backend backs its tables), so the
limit is the memory system's, not the TLB's. Reported: lookups/s and GB/s (row bytes
read per second), per row size and thread count; ``tools/bench_embedding.py`` reports every
kernel's lookups/s as a fraction of it.

Every timed call reads ids of its own (drawn for it, the same for every schedule) after a
write pass over a buffer twice the last-level cache (``--flush-mib``; 512 MiB where the cache
size is unknown; calibration's ``CacheEvictor``), so that a call finds few rows in cache: its
ids meet an earlier call's rows only by chance (1M rows of 256 B are 12.5% of a 2 GiB table),
and the pass evicts most of those (not all: a last-level cache's replacement policy can keep
lines read more than once; on the Intel Xeon VM of 2026-12-06 a 64 MiB chain answered in 40-42
ns a read after a 600 MiB write pass, 40-73 after a read pass, 31 without any, 100-150 from a
2 GiB table). The limit is for rows from DRAM, as a batch's rows mostly come.
(Until 2026-12-06 every call read the same ids: on that VM, with a 300 MiB last-level cache, 1M
ids of 256 B rows read again found most of their 256 MB there, 74-76 M lookups/s at one thread,
against 39-55 M read cold.)

The memory latency (``latency_ns``): a chain of dependent reads over the same table
(``neo._C.chase_probe``: rows of 256 B in one random cycle, each holding the next row's index,
2^18 steps after the flush, the median of three chains). With it, Little's law gives the cache
lines a gather keeps in flight on average (``lines_in_flight`` = lookups/s x lines a row x
latency): set beside what a core can track (16 L1 misses on Intel's Golden Cove and its
successors, its fill buffers; a few dozen more through prefetches into L2, its miss queue) it
says whether a faster gather is left to find.

Whether the limit could be beaten, in the same run:

- ``--wide`` adds schedules whose far prefetch differs, at each far distance of the default
  ones: ``prefetcht2`` instead of ``prefetcht1`` (``t2``), non-temporal (``nta``), and only
  every other line of a row (``every2``: the L2's adjacent-line prefetcher may bring the
  rest, using none of the core's fill buffers). The limit is the best of every schedule run.
- ``--sorted`` also reads the same ids sorted by row (address order, as a kernel that sorted
  its ids first would, the sort not counted): ``lookups_per_s_sorted`` and its best schedule.
  Not part of the limit: a batch's rows in batch order are what every kernel compared here reads.

JSON fields per record: ``row_bytes``, ``threads``, ``lookups_per_s``, ``gb_per_s``,
``best_prefetch`` (a schedule: ``near,far`` or ``near,far,t2|nta|every2``),
``lookups_per_s_by_prefetch``, ``latency_ns``, ``lines_in_flight``, ``flush_mib``, with ``--sorted``
also ``lookups_per_s_sorted``,
``best_prefetch_sorted``, ``lookups_per_s_sorted_by_prefetch``; ``table_gib``, ``table_rows``,
``lookups``, ``dim``, ``machine``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import (add_isa_arg, apply_isa, describe_machine, json_path, machine_info,  # noqa: E402
                          multiple_of_list, nonneg_int, positive_float, positive_int, positive_int_list,
                          write_json)

import torch  # noqa: E402

# (near, far) prefetch distances tried; (0, 0) = hardware prefetchers only.
DISTANCES = ((0, 0), (8, 0), (16, 0), (32, 0), (64, 0), (16, 128), (32, 256), (64, 512))
# --wide: the far prefetch's variants, name -> (locality hint, every n-th line), the default
# being prefetcht1 (hint 1) of every line.
FAR_VARIANTS = {"t2": (2, 1), "nta": (0, 1), "every2": (1, 2)}


def schedules(wide: bool) -> List[Tuple[str, int, int, int, int]]:
    """(name, near, far, far_hint, far_every) of every schedule run: DISTANCES, and with
    `wide` each far distance's FAR_VARIANTS."""
    out = [(f"{near},{far}", near, far, 1, 1) for near, far in DISTANCES]
    if wide:
        out += [(f"{near},{far},{v}", near, far, hint, every)
                for near, far in DISTANCES if far for v, (hint, every) in FAR_VARIANTS.items()]
    return out


HUGE_PAGE = 2 << 20


def table_bytes(gib: float) -> int:
    """`gib` GiB rounded up to whole huge pages (whole 8-byte words too), at least one."""
    return max(1, -(-int(gib * (1 << 30)) // HUGE_PAGE)) * HUGE_PAGE


def make_table(gib: float) -> torch.Tensor:
    """A flat table of at least `gib` GiB (table_bytes), its pages touched and advised onto huge pages."""
    from neo import _C

    t = torch.empty(table_bytes(gib), dtype=torch.uint8)
    t.view(torch.int64).fill_(1)
    _C.advise_hugepages(t)
    return t


def flush_mib_default(caches: Dict[str, str]) -> int:
    """Twice the last-level cache (``cpu_caches`` of machine_info, sizes like ``'307200K'``) in
    MiB, at least 1; 512 where no cache size is known."""
    from neo.cpp import cache_size_bytes

    sizes = [b for b in (cache_size_bytes((caches or {}).get(k)) for k in ("L2", "L3")) if b]
    return max(1, -(-2 * max(sizes) // (1 << 20))) if sizes else 512


def evictor(mib: int) -> Callable[[], None]:
    """What runs before each timed call: a write pass over `mib` MiB (``neo.calibrate``'s
    :class:`~neo.calibrate.measure.CacheEvictor`, which calibration runs before its timed lookups
    for the same reason), or nothing where `mib` is 0."""
    from neo.calibrate.measure import CacheEvictor

    return CacheEvictor(mib << 20) if mib else (lambda: None)


CHASE_ROW_BYTES = 256      # the latency chain's rows: whole lines, each hop on a line of its own
CHASE_STEPS = 1 << 18


def memory_latency_ns(table: torch.Tensor, flush: Callable[[], None], steps: int = CHASE_STEPS, chains: int = 3,
                      seed: int = 0) -> float:
    """Nanoseconds per dependent read over `table` (module doc), the median of `chains` chains,
    each after `flush` (:func:`evictor`). Writes the chain into the first 8 bytes of each 256-byte row."""
    from neo import _C

    rows = table.numel() // CHASE_ROW_BYTES
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    table[: rows * CHASE_ROW_BYTES].view(torch.int64).view(rows, CHASE_ROW_BYTES // 8)[perm, 0] = perm.roll(-1)
    times = []
    for c in range(chains):
        flush()
        t0 = time.perf_counter()
        _C.chase_probe(table, CHASE_ROW_BYTES, int(perm[c * rows // chains]), steps)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / steps * 1e9


def _time_schedules(table: torch.Tensor, row_bytes: int, id_sets: Sequence[torch.Tensor], scheds: Sequence,
                    flush: Callable[[], None]) -> Dict[str, float]:
    """Lookups/s of every schedule: a warm-up call on id_sets[0], then one timed call on each
    later set, each after `flush`; the median."""
    from neo import _C

    out = {}
    for name, near, far, hint, every in scheds:
        _C.gather_probe(table, row_bytes, id_sets[0], near, far, hint, every)          # warm-up
        times = []
        for ids in id_sets[1:]:
            flush()
            t0 = time.perf_counter()
            _C.gather_probe(table, row_bytes, ids, near, far, hint, every)
            times.append(time.perf_counter() - t0)
        out[name] = id_sets[1].numel() / statistics.median(times)
    return out


def probe(table: torch.Tensor, row_bytes: int, threads: int, lookups: int = 1 << 20, reps: int = 5,
          wide: bool = False, sorted_too: bool = False, seed: int = 0, flush: Callable[[], None] = lambda: None,
          latency_ns: Optional[float] = None) -> Dict:
    """The best (median over `reps` calls, each on ids of its own after `flush`, :func:`evictor`)
    gather speed over the schedules for rows of `row_bytes`; with `sorted_too` also on the same
    ids in address order (module doc); with `latency_ns` the lines kept in flight."""
    rows = table.numel() // row_bytes
    g = torch.Generator().manual_seed(seed)
    id_sets = [torch.randint(0, rows, (lookups,), generator=g) for _ in range(reps + 1)]
    scheds = schedules(wide)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        by_schedule = _time_schedules(table, row_bytes, id_sets, scheds, flush)
        by_schedule_sorted = (_time_schedules(table, row_bytes, [i.sort().values for i in id_sets], scheds, flush)
                              if sorted_too else None)
    finally:
        torch.set_num_threads(prev)
    best = max(by_schedule, key=by_schedule.get)
    lps = by_schedule[best]
    rec = {"row_bytes": row_bytes, "threads": threads, "lookups_per_s": lps, "gb_per_s": lps * row_bytes / 1e9,
           "best_prefetch": best, "lookups_per_s_by_prefetch": by_schedule, "table_gib": table.numel() / (1 << 30),
           "table_rows": rows, "lookups": lookups, "latency_ns": latency_ns,
           "lines_in_flight": (lps * -(-row_bytes // 64) * latency_ns * 1e-9) if latency_ns else None}
    if by_schedule_sorted is not None:
        best_s = max(by_schedule_sorted, key=by_schedule_sorted.get)
        rec.update(lookups_per_s_sorted=by_schedule_sorted[best_s], best_prefetch_sorted=best_s,
                   lookups_per_s_sorted_by_prefetch=by_schedule_sorted)
    return rec


def print_probe(records: List[Dict]) -> None:
    sorted_too = any("lookups_per_s_sorted" in r for r in records)
    if records[0].get("latency_ns"):
        print(f"\nmemory latency: {records[0]['latency_ns']:.0f} ns a dependent read (lines in flight = "
              "lookups/s x lines a row x latency)")
    print(f"\n{'row bytes':>9} {'threads':>7} {'Mlookups/s':>11} {'GB/s':>7} {'best prefetch':>20} {'in flight':>9}"
          + (f" {'sorted Mlookups/s':>18} {'sorted / random':>15}" if sorted_too else ""))
    for r in records:
        flight = f"{r['lines_in_flight']:>9.1f}" if r.get("lines_in_flight") else f"{'-':>9}"
        line = (f"{r['row_bytes']:>9} {r['threads']:>7} {r['lookups_per_s'] / 1e6:>11.1f} {r['gb_per_s']:>7.1f} "
                f"{r['best_prefetch']:>20} {flight}")
        if "lookups_per_s_sorted" in r:
            line += f" {r['lookups_per_s_sorted'] / 1e6:>18.1f} {r['lookups_per_s_sorted'] / r['lookups_per_s']:>14.2f}x"
        print(line)
    if len(records[0]["lookups_per_s_by_prefetch"]) > len(DISTANCES):   # --wide: every schedule against the best
        print("\nevery schedule, Mlookups/s (random order):")
        for r in records:
            cells = "  ".join(f"{k} {v / 1e6:.1f}" for k, v in r["lookups_per_s_by_prefetch"].items())
            print(f"  {r['row_bytes']} B, {r['threads']} thread(s): {cells}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=multiple_of_list(16), default=[64, 128, 256],
                   help="row lengths in fp32 elements (row bytes = 4 x dim: whole 64-byte lines, so multiples of 16)")
    p.add_argument("--threads", type=positive_int_list, default=[1, 2], help="comma-separated thread counts, e.g. 1,2")
    p.add_argument("--table-gib", type=positive_float, default=2.0)
    p.add_argument("--lookups", type=positive_int, default=1 << 20)
    p.add_argument("--reps", type=positive_int, default=5,
                   help="timed calls per schedule, each on ids of its own (the median is kept)")
    p.add_argument("--flush-mib", type=nonneg_int, default=None,
                   help="MiB read before each timed call (default: twice the last-level cache; 0: none)")
    p.add_argument("--wide", action="store_true",
                   help="also the far prefetch's variants: prefetcht2, non-temporal, every other line")
    p.add_argument("--sorted", action="store_true", help="also the same ids in address order (not part of the limit)")
    add_isa_arg(p)
    p.add_argument("--json", metavar="FILE", type=json_path)
    args = p.parse_args(argv)
    if 4 * max(args.dims) > table_bytes(args.table_gib):
        p.error(f"argument --dims: rows of {4 * max(args.dims)} bytes do not fit a --table-gib "
                f"{args.table_gib} table ({table_bytes(args.table_gib)} bytes)")
    apply_isa(args.isa)
    from bench_common import start_rank

    start_rank(torch.get_num_threads(), system_malloc=False)
    machine = machine_info(args.isa)
    print(describe_machine(machine))
    table = make_table(args.table_gib)
    flush_mib = flush_mib_default(machine["cpu_caches"]) if args.flush_mib is None else args.flush_mib
    flush = evictor(flush_mib)
    latency = memory_latency_ns(table, flush)
    records = [dict(probe(table, 4 * d, t, args.lookups, args.reps, args.wide, args.sorted, flush=flush,
                          latency_ns=latency), dim=d, flush_mib=flush_mib, machine=machine)
               for d in args.dims for t in args.threads]
    print_probe(records)
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
