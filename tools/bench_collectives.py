"""AlltoAll, AllGather and AllReduce between the ranks of one host: Neo's shared-memory exchange against gloo.

    python tools/bench_collectives.py                       # W = 2, 0.06 to 8 MB per peer
    python tools/bench_collectives.py --world-size 4 --json bench_out/collectives.json

Each rank sends ``size`` bytes of fp32 to every peer (AlltoAll) or contributes ``size``
bytes (AllGather; AllReduce: a sum in place, as DDP's gradient buckets are reduced, the
shared-memory side by ``neo.distributed.ddp_hook.all_reduce_sum_``, the comm hook's reduction).
Per size: ``--warmup`` then ``--iters`` iterations, each running every (collective, transport)
once, interleaved in a new order per iteration (bench_common.call_orders, picked by the
iteration index alone, so every rank runs the same sequence), a barrier before each call;
reported: the median wall time of the slowest rank and the CPU time per call (this process: the
calling thread plus gloo's I/O threads). Then ``--chain`` calls of each back to back with no
barrier between them, as a training step issues its small collectives: the time per call of the
slowest rank (``chain_us``), which the barrier-separated time hides under the barrier's own exit
skew. Results are checked before timing: equal between the transports, and the AllReduce's
against the rank-order sum of the inputs (bit for bit; gloo's to 1e-5 beyond W = 2, its own order).

Output: a table with the gloo / shared-memory ratio and, with ``--json``, records with
``collective`` (``all_to_all``, ``all_gather``, ``all_reduce``), ``transport``, ``world_size``,
``bytes_per_peer``, ``ms``, ``cpu_ms``, ``chain_us``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench_common import json_path, nonneg_int, positive_float, positive_int  # noqa: E402
from bench_common import describe_machine, machine_info, start_rank, time_interleaved, write_json  # noqa: E402


def _rank_main(rank: int, world_size: int, args) -> List[Dict[str, Any]]:
    from neo.distributed.comms import sum_in_rank_order
    from neo.distributed.ddp_hook import all_reduce_sum_
    from neo.distributed.shm import ShmExchange

    start_rank(1, False)
    ex = ShmExchange.create(dist.group.WORLD)
    if ex is None:
        raise RuntimeError("the ranks cannot share /dev/shm")
    W, records = world_size, []
    for mb in args.sizes:
        n = int(mb * 2**20) // 4                                         # fp32 per peer
        send = torch.randn(W * n)
        calls = {
            ("all_to_all", "shm"): lambda out: ex.all_to_all_single(out, send, [n] * W, [n] * W).wait(),
            ("all_to_all", "gloo"): lambda out: dist.all_to_all_single(out, send),
            ("all_gather", "shm"): lambda out: ex.all_gather_single(out, send[:n]).wait(),
            ("all_gather", "gloo"): lambda out: dist.all_gather_into_tensor(out, send[:n]),
            ("all_reduce", "shm"): lambda out: all_reduce_sum_(ex, out),          # in place: out grows
            ("all_reduce", "gloo"): lambda out: dist.all_reduce(out),
        }
        outs = {k: (send[:n].clone() if k[0] == "all_reduce" else torch.empty(W * n)) for k in calls}
        for (coll, transport), fn in calls.items():
            fn(outs[(coll, transport)])
        for coll in ("all_to_all", "all_gather"):
            if not torch.equal(outs[(coll, "shm")], outs[(coll, "gloo")]):
                raise AssertionError(f"{coll}: shared memory and gloo disagree at {mb} MB")
        # AllReduce: the sum in rank order (from gloo's AllGather) is the oracle; shared memory sums in
        # that order (bit for bit), gloo in its own (the same bits only at W = 2)
        expected = sum_in_rank_order(outs[("all_gather", "gloo")].view(W, n))
        if not torch.equal(outs[("all_reduce", "shm")], expected):
            raise AssertionError(f"all_reduce: shared memory differs from the rank-order sum at {mb} MB")
        gloo_sum = outs[("all_reduce", "gloo")]
        if not (torch.equal(gloo_sum, expected) if W == 2 else torch.allclose(gloo_sum, expected, atol=1e-5)):
            raise AssertionError(f"all_reduce: gloo differs from the rank-order sum at {mb} MB")
        timed = time_interleaved({k: (lambda fn=fn, out=outs[k]: fn(out)) for k, fn in calls.items()},
                                 args.warmup, args.iters, before=dist.barrier)
        for (coll, transport), t in timed.items():
            out, fn = outs[(coll, transport)], calls[(coll, transport)]
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.chain):
                fn(out)
            chain = (time.perf_counter() - t0) / args.chain
            mine = torch.tensor([statistics.median(t.wall), statistics.median(t.cpu), chain])
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            records.append({"collective": coll, "transport": transport, "world_size": W,
                            "bytes_per_peer": 4 * n, "ms": round(1e3 * float(mine[0]), 3),
                            "cpu_ms": round(1e3 * float(mine[1]), 3), "chain_us": round(1e6 * float(mine[2]), 1)})
    ex.close()
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=positive_int, default=2)
    p.add_argument("--sizes", type=positive_float, nargs="+", default=[0.0625, 0.5, 2, 8], help="MB per peer")
    p.add_argument("--iters", type=positive_int, default=30)
    p.add_argument("--warmup", type=nonneg_int, default=5)
    p.add_argument("--chain", type=positive_int, default=200, help="back-to-back calls timed per collective")
    p.add_argument("--json", metavar="FILE", type=json_path)
    args = p.parse_args(argv)
    from tests.multiprocess import run_multiprocess

    records = run_multiprocess(_rank_main, args.world_size, args, timeout_s=1800, collective_timeout_s=600,
                               threads=1, env={"OMP_NUM_THREADS": "1"})[0]
    machine = machine_info()
    print(describe_machine(machine))
    for r in records:
        r["machine"] = machine
    by = {(r["collective"], r["transport"], r["bytes_per_peer"]): r for r in records}
    print(f"W={args.world_size}  {'collective':11} {'MB/peer':>8} {'shm ms':>8} {'gloo ms':>8} {'gloo/shm':>9} "
          f"{'shm cpu':>8} {'gloo cpu':>8} {'chain us: shm':>14} {'gloo':>7}")
    for (coll, transport, nb), r in by.items():
        if transport == "shm":
            g = by[(coll, "gloo", nb)]
            print(f"     {coll:11} {nb / 2**20:8.3f} {r['ms']:8.3f} {g['ms']:8.3f} {g['ms'] / r['ms']:8.2f}x "
                  f"{r['cpu_ms']:8.3f} {g['cpu_ms']:8.3f} {r['chain_us']:14.1f} {g['chain_us']:7.1f}")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
