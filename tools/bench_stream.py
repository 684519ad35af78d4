"""One core's memory bandwidth by working-set size: the floor under memory-bound kernels (the
fused interaction moves 49 MB a forward + backward at B 2048, D 64; docs/benchmarks.md).

    python tools/bench_stream.py                          # 1 thread, 1 MB .. 512 MB
    python tools/bench_stream.py --json bench_out/stream.json

On float32 arrays of each size: ``read`` (``torch.sum``, bytes read) and ``copy`` (``Tensor.copy_``,
bytes read plus written), the best of several passes (more for the small sizes, which the caches
hold), at ``--threads`` torch threads. GB/s are 1e9 bytes a second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import json_path, positive_int, positive_int_list  # noqa: E402
from bench_common import describe_machine, machine_info, write_json  # noqa: E402

SIZES_MB = (1, 4, 16, 32, 64, 128, 512)


def measure(mb: int) -> Dict[str, float]:
    """{"read": GB/s, "copy": GB/s} over a working set of ``mb`` MiB (copy: source + destination)."""
    import torch

    x = torch.randn(mb * (1 << 20) // 4)
    y = torch.empty_like(x)
    out = {}
    for name, fn, nbytes in (("read", lambda: x.sum(), x.numel() * 4), ("copy", lambda: y.copy_(x), 2 * x.numel() * 4)):
        best = float("inf")
        for _ in range(max(3, 256 // mb)):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        out[name] = nbytes / best / 1e9
    return out


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=positive_int_list, default=",".join(map(str, SIZES_MB)),
                   help="comma-separated working sets in MiB")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--json", default=None, type=json_path)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    machine = machine_info()
    print(describe_machine(machine))
    records = []
    for mb in args.sizes:
        r = measure(mb)
        records.append({"mib": mb, "threads": args.threads, "read_gb_s": round(r["read"], 2),
                        "copy_gb_s": round(r["copy"], 2), "machine": machine})
        print(f"{mb:>5} MiB: read {r['read']:6.1f} GB/s, copy {r['copy']:6.1f} GB/s")
    if args.json:
        write_json(args.json, {"records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
