"""This machine's random-row gather limit: the ceiling for any embedding forward lookup.

    python tools/bench_gather_probe.py                          # rows of 64, 128, 256 floats; 1 and 2 threads
    python tools/bench_gather_probe.py --isa avx2 --json bench_out/probe.json

The probe (``neo._C.gather_probe``, csrc/kernels/probe.h) reads rows at uniformly random
positions of a table much larger than the last-level cache (2 GiB by default; this machine's
L3 is 32 MiB) and sums them into registers: no bags, no output, no checks, ids split evenly
over the threads. It runs with several software-prefetch distances (into L1 ``near`` ids
ahead, into L2 ``far`` ids ahead) and the best is the limit. The table is backed by
transparent huge pages where the kernel allows (as Neo's backend backs its tables), so the
limit is the memory system's, not the TLB's. Reported: lookups/s and GB/s (row bytes
read per second), per row size and thread count; ``tools/bench_embedding.py`` reports every
kernel's lookups/s as a fraction of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import add_isa_arg, apply_isa, describe_machine, machine_info, write_json  # noqa: E402

import torch  # noqa: E402

# (near, far) prefetch distances tried; (0, 0) = hardware prefetchers only.
DISTANCES = ((0, 0), (8, 0), (16, 0), (32, 0), (64, 0), (16, 128), (32, 256), (64, 512))


def make_table(gib: float) -> torch.Tensor:
    """A flat table of `gib` GiB, its pages touched and advised onto huge pages."""
    from neo import _C

    t = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8)
    t.view(torch.int64).fill_(1)
    _C.advise_hugepages(t)
    return t


def probe(table: torch.Tensor, row_bytes: int, threads: int, lookups: int = 1 << 20, reps: int = 5,
          distances: Sequence = DISTANCES, seed: int = 0) -> Dict:
    """The best (median over `reps`) gather speed over `distances` for rows of `row_bytes`."""
    from neo import _C

    rows = table.numel() // row_bytes
    ids = torch.randint(0, rows, (lookups,), generator=torch.Generator().manual_seed(seed))
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        by_distance = {}
        for near, far in distances:
            _C.gather_probe(table, row_bytes, ids, near, far)                   # warm-up
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                _C.gather_probe(table, row_bytes, ids, near, far)
                times.append(time.perf_counter() - t0)
            by_distance[f"{near},{far}"] = lookups / statistics.median(times)
    finally:
        torch.set_num_threads(prev)
    best = max(by_distance, key=by_distance.get)
    lps = by_distance[best]
    return {"row_bytes": row_bytes, "threads": threads, "lookups_per_s": lps, "gb_per_s": lps * row_bytes / 1e9,
            "best_prefetch": best, "lookups_per_s_by_prefetch": by_distance, "table_gib": table.numel() / (1 << 30),
            "table_rows": rows, "lookups": lookups}


def print_probe(records: List[Dict]) -> None:
    print(f"\n{'row bytes':>9} {'threads':>7} {'Mlookups/s':>11} {'GB/s':>7} {'best prefetch (near,far)':>25}")
    for r in records:
        print(f"{r['row_bytes']:>9} {r['threads']:>7} {r['lookups_per_s'] / 1e6:>11.1f} {r['gb_per_s']:>7.1f} "
              f"{r['best_prefetch']:>25}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256],
                   help="row lengths in fp32 elements (row bytes = 4 x dim)")
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--table-gib", type=float, default=2.0)
    p.add_argument("--lookups", type=int, default=1 << 20)
    add_isa_arg(p)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    apply_isa(args.isa)
    from bench_common import start_rank

    start_rank(torch.get_num_threads(), system_malloc=False)
    machine = machine_info(args.isa)
    print(describe_machine(machine))
    table = make_table(args.table_gib)
    records = [dict(probe(table, 4 * d, t, args.lookups), dim=d, machine=machine)
               for d in args.dims for t in args.threads]
    print_probe(records)
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
