"""The ids' range check of the input distribution: one C++ pass per ISA variant against torch.

    python tools/bench_id_check.py                                   # the multi-hot batch, 1 thread
    python tools/bench_id_check.py --threads 1,2 --json bench_out/id_check.json

Before its ids leave a rank, the input distribution counts each feature's ids outside its table
(``neo.embedding.checks.count_bad_ids``) and, for the int32 wire, narrows them to int32 clamped
to [-1, 2^31 - 1] (``count_bad_ids_to_int32``). On the CPU both are one pass of
``neo._C.check_id_ranges``; ``count_bad_ids_reference`` is the same count in torch operations (the
oracle in the tests), and ``clamp`` + ``to(int32)`` the narrowing. Timed on one rank's batch of
the multi-hot workload of ``tools/bench_train.py`` (26 features with the MLPerf DLRM-DCNv2 bag
sizes, ``--batch`` samples: 438,272 ids at 2048), ids uniform below ``--rows``, ``--bad`` of them
out of range. Systems: ``torch`` (count), ``torch+int32`` (count, clamp, cast), and per ISA variant
this CPU runs up to the --isa cap (``neo.cpp.use_cpu_isa``) ``neo-ISA`` and ``neo-ISA+int32``; all interleaved
(bench_common.time_interleaved), results checked equal to torch's first.

Output: a table (median ms, torch / Neo) and, with ``--json``, records with ``system``, ``isa``,
``threads``, ``ids``, ``ms``, ``vs_torch`` (the torch system doing the same work, over this one)
and ``machine``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
import torch  # noqa: E402

from bench_common import add_timing_args, positive_int, start_one_process, time_interleaved, write_json  # noqa: E402
from bench_train import MULTI_HOT  # noqa: E402

from neo.cpp import use_cpu_isa  # noqa: E402
from neo.embedding.checks import count_bad_ids, count_bad_ids_reference, count_bad_ids_to_int32  # noqa: E402


def make_batch(batch: int, rows: int, bad: float, seed: int = 0):
    """(values, offsets, rows per feature) of one rank's multi-hot batch, feature-major."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(MULTI_HOT).repeat_interleave(batch)                     # (F * B,)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.randint(0, rows, (int(offsets[-1]),), generator=gen)
    n_bad = int(bad * values.numel())
    if n_bad:
        where = torch.randperm(values.numel(), generator=gen)[:n_bad]
        values[where] = torch.where(torch.rand(n_bad, generator=gen) < 0.5, -1, rows)
    return values, offsets, torch.full((len(MULTI_HOT),), rows, dtype=torch.int64)


def systems(values, offsets, B: int, rows: torch.Tensor, isas: List[str]) -> Dict[str, tuple]:
    """name -> (isa or None, the torch system it is compared with, call)."""
    def in_isa(isa: str, fn: Callable) -> Callable:
        def call():
            with use_cpu_isa(isa):
                return fn()
        return call

    out = {"torch": (None, "torch", lambda: count_bad_ids_reference(values, offsets, B, rows)),
           "torch+int32": (None, "torch+int32", lambda: (count_bad_ids_reference(values, offsets, B, rows),
                                                          values.clamp(-1, 2 ** 31 - 1).to(torch.int32)))}
    for isa in isas:
        out[f"neo-{isa}"] = (isa, "torch", in_isa(isa, lambda: count_bad_ids(values, offsets, B, rows)))
        out[f"neo-{isa}+int32"] = (isa, "torch+int32", in_isa(isa, lambda: count_bad_ids_to_int32(values, offsets, B, rows)))
    return out


def check(calls: Dict[str, tuple]) -> None:
    """Every Neo system's result equal to the torch system it is compared with."""
    ref = {name: calls[name][2]() for name in ("torch", "torch+int32")}
    for name, (isa, peer, fn) in calls.items():
        got, want = fn(), ref[peer]
        same = torch.equal(got, want) if peer == "torch" else all(torch.equal(a, b) for a, b in zip(got, want))
        if not same:
            raise AssertionError(f"{name} differs from {peer}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=positive_int, default=2048, help="samples (one rank's batch)")
    p.add_argument("--rows", type=positive_int, default=100_000, help="rows of every table")
    p.add_argument("--bad", type=float, default=0.0, help="fraction of ids out of range (-1 or rows)")
    add_timing_args(p, iters=30, warmup=3)
    args = p.parse_args(argv)
    if not 0.0 <= args.bad <= 1.0:
        p.error(f"argument --bad: a fraction in [0, 1], got {args.bad}")
    machine = start_one_process(args)
    from neo import _C

    supported = list(_C.cpu_isa_supported())                           # baseline first
    values, offsets, rows = make_batch(args.batch, args.rows, args.bad)
    calls = systems(values, offsets, args.batch, rows, supported[:supported.index(_C.cpu_isa()) + 1])
    check(calls)
    records: List[Dict[str, Any]] = []
    prev = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            timed = time_interleaved({k: v[2] for k, v in calls.items()}, args.warmup, args.iters)
            ms = {k: 1e3 * statistics.median(t.wall) for k, t in timed.items()}
            for name, (isa, peer, _) in calls.items():
                records.append({"system": name, "isa": isa, "threads": threads, "ids": values.numel(),
                                "bad_ids": int(((values < 0) | (values >= args.rows)).sum()),
                                "ms": round(ms[name], 4), "vs_torch": round(ms[peer] / ms[name], 2),
                                "machine": machine})
    finally:
        torch.set_num_threads(prev)
    print(f"{values.numel():,} ids, {len(MULTI_HOT)} features")
    print(f"{'system':20} {'threads':>7} {'ms':>9} {'torch / this':>13}")
    for r in records:
        print(f"{r['system']:20} {r['threads']:7} {r['ms']:9.3f} {r['vs_torch']:12.2f}x")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
