"""Benchmark Neo's sharded embedding runtime against TorchRec's DistributedModelParallel (CPU, gloo).

    python tools/bench_sharded.py                                    # W = 2 and 4, all types, TorchRec TW/CW
    python tools/bench_sharded.py --world-sizes 2 --types table_wise --steps 5 --json bench_out/sharded.json
    python tools/bench_sharded.py --quick                            # small smoke run (seconds)

Workload (defaults, as the issue states): 8 tables of 100k rows, D = 64, fp32, one feature
each, sum pooling, batch 2048 per rank, bag lengths uniform in 1..39 (20 on average), ids
uniform; fused SGD (lr 0.01); one training step = forward + backward (+ fused update) of
the embeddings with a fixed random upstream gradient (no dense layers).

Each world size runs in one spawned gloo group (``tests/multiprocess.py``), one torch
thread per process (OMP_NUM_THREADS=1). Per system and sharding type: ``--warmup`` steps,
then ``--steps`` timed steps, a barrier before each (not timed); Neo's and TorchRec's
steps alternate (step i of one, then step i of the other) so that load from other
processes on a shared machine hits both alike. Neo's step is split into
its phases: input distribution (both AlltoAlls, until the local batch is built), lookup
(local forward), output distribution (pooled collectives), backward (reverse collectives
+ fused update). Reported per phase: the median over steps, averaged over ranks;
``step_ms`` is the slowest rank's median step. TorchRec: table_wise and column_wise
(its planner forced by ParameterConstraints, compute device cpu, fused EXACT_SGD), forward
and backward timed separately. Column-wise uses shards of ``--cw-dim`` columns in both. The other
sharding types run Neo alone; TorchRec's absence there is a note record (``note``, ``step_ms``
null), as where torchrec / fbgemm_gpu do not import.

Both systems start from the same tables (Neo's initial weights copied into TorchRec's shards), and
their pooled outputs of the first step (the same batch, before any update) are compared:
``max_abs_diff_vs_neo`` in TorchRec's records, the largest over ranks.

``--isa avx2`` caps every library of both systems (Neo's kernels, ATen, oneDNN, MKL, FBGEMM)
at AVX2 in every process (tools/bench_common.py), so an AVX-512 machine stands in for an AVX2 one.

Output: a table on stdout and, with ``--json``, a list of records with ``system``,
``sharding_type``, ``world_size``, ``step_ms`` (and the phases) and ``machine`` (CPU model,
ISA flags, the --isa cap, the ISA Neo's kernels and ATen chose, and ``memory_latency_ns``: a
dependent read from DRAM before and after the runs, printed too; bench_common.memory_latency_ns).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench_common import (add_isa_arg, add_no_shm_arg, add_system_malloc_arg, apply_isa, machine_info,  # noqa: E402
                          memory_latency_ns, note_memory_latency, run_world_sizes, shard_torchrec, start_rank,
                          write_json)
from bench_common import add_sharded_workload_args, apply_quick, json_path, positive_int  # noqa: E402
import torch.distributed as dist  # noqa: E402

NEO_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "table_column_wise", "data_parallel")
TORCHREC_TYPES = ("table_wise", "column_wise")


def _batches(args, rank: int, n: int = 3):
    from neo.sparse import KeyedJaggedBatch

    gen = torch.Generator().manual_seed(100 + rank)
    keys = tuple(f"f{t}" for t in range(args.tables))
    out = []
    for _ in range(n):
        lengths = torch.randint(1, 2 * args.mean_ids, (args.tables * args.batch,), generator=gen)
        ids = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
        out.append(KeyedJaggedBatch(keys, ids, lengths, args.batch))
    return out


def _tables(args):
    from neo.config.embedding import OptimizerConfig, TableConfig

    return [TableConfig(f"t{t}", args.rows, args.dim, feature_names=(f"f{t}",),
                        optimizer=OptimizerConfig("sgd", lr=0.01)) for t in range(args.tables)]


def _summary(times: Dict[str, List[float]]) -> Dict[str, float]:
    """Median over the timed steps, in ms (robust to the spikes of a shared machine)."""
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


class _Runner:
    """One system x sharding type: ``step(i)`` runs training step i and returns its phase times (s)
    and its pooled output (B, F x D); ``first_output``: step 0's, before any update."""

    def __init__(self, system: str, sharding_type: str, step):
        self.system, self.sharding_type, self.step = system, sharding_type, step
        self.times: Dict[str, List[float]] = {}
        self.first_output: Optional[torch.Tensor] = None

    def record(self, phases: Dict[str, float]) -> None:
        for k, v in phases.items():
            self.times.setdefault(k, []).append(v)


def _neo_runner(args, st: str, pg) -> Tuple[_Runner, Any]:
    """Neo's runner and its ShardedEmbeddingCollection (whose initial tables TorchRec copies)."""
    from neo.distributed import ShardedEmbeddingCollection, even_plan

    tables = _tables(args)
    plan = even_plan(tables, {t.name: st for t in tables}, pg.world_size, pg.local_world_size,
                     column_shards=args.dim // args.cw_dim)
    from neo.distributed import CommConfig

    sec = ShardedEmbeddingCollection(tables, plan, pg, backend=args.backend, validate=not args.no_validate,
                                     comm=CommConfig(forward=args.comm, backward=args.comm))
    batches = _batches(args, pg.rank)
    grad = torch.randn(args.batch, sec.output_dim, generator=torch.Generator().manual_seed(7))

    def step(i: int) -> Dict[str, float]:
        t0 = time.perf_counter()
        db = sec.input_dist(batches[i % len(batches)]).wait()
        t1 = time.perf_counter()
        pooled = sec.compute(db)
        t2 = time.perf_counter()
        out = sec.output_dist(pooled, db).wait()
        t3 = time.perf_counter()
        out.backward(grad)
        t4 = time.perf_counter()
        return {"input_dist_ms": t1 - t0, "lookup_ms": t2 - t1, "output_dist_ms": t3 - t2,
                "backward_ms": t4 - t3, "step_ms": t4 - t0}, out

    return _Runner("neo" if args.comm == "fp32" else f"neo-{args.comm}", st, step), sec


def _torchrec_runner(args, st: str, pg, weights: Dict[str, torch.Tensor]) -> _Runner:
    """TorchRec's DMP, starting from Neo's tables ``weights`` (full, by name)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{t}", embedding_dim=args.dim,
                                                            num_embeddings=args.rows, feature_names=[f"f{t}"])
                                         for t in range(args.tables)], device=torch.device("meta"))
    model = shard_torchrec(ebc, EmbeddingBagCollectionSharder, st, args.cw_dim, pg, weights)
    kjts = [b.to_torchrec() for b in _batches(args, pg.rank)]
    grad = torch.randn(args.batch, args.tables * args.dim, generator=torch.Generator().manual_seed(7))

    def step(i: int) -> Dict[str, float]:
        t0 = time.perf_counter()
        pooled = model(kjts[i % len(kjts)])
        out = pooled.values()
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        # its features in the order of its shards (table-wise: each rank's tables together); in
        # Neo's order (f0, f1, ...) for the comparison, outside the timed part
        in_order = torch.cat([pooled[f"f{t}"] for t in range(args.tables)], dim=1) if i == 0 else out
        return {"forward_ms": t1 - t0, "backward_ms": t2 - t1, "step_ms": t2 - t0}, in_order

    return _Runner("torchrec", st, step)


def _rank_main(rank: int, world_size: int, args) -> List[Dict[str, Any]]:
    """Per sharding type: Neo and TorchRec built side by side, their steps interleaved."""
    import datetime

    from neo.distributed import ProcessGroups

    start_rank(args.threads, args.system_malloc)
    machine = machine_info(args.isa)   # in the rank: the ISA its kernels and ATen chose
    pg = ProcessGroups.build(world_size, timeout=datetime.timedelta(seconds=300), shm=not args.no_shm)
    records = []
    for st in args.types:
        neo, sec = _neo_runner(args, st, pg)
        runners = [neo]
        notes = {}
        if not args.no_torchrec and st not in TORCHREC_TYPES:
            notes["torchrec"] = f"left out: no TorchRec runner for {st} here (only {', '.join(TORCHREC_TYPES)})"
        elif not args.no_torchrec:
            try:
                runners.append(_torchrec_runner(args, st, pg, sec.full_weights()))
            except ImportError as e:                       # torchrec / fbgemm not installed
                notes["torchrec"] = f"skipped: {type(e).__name__}: {e}"
        for i in range(args.warmup + args.steps):
            for r in runners:                              # interleaved: machine load hits both alike
                dist.barrier(group=pg.world)
                phases, out = r.step(i)
                if i == 0:                                 # the same batch on the same tables in both
                    r.first_output = out.detach().clone()
                if i >= args.warmup:
                    r.record(phases)
        for r in runners:
            mine = _summary(r.times)
            gathered: List[Any] = [None] * world_size
            dist.all_gather_object(gathered, mine, group=pg.world)
            rec = {"system": r.system, "sharding_type": st, "world_size": world_size,
                   "step_ms": max(g["step_ms"] for g in gathered), "steps": args.steps,
                   "retain_freed_memory": not args.system_malloc, "neo_shm_collectives": pg.uses_shm,
                   "machine": machine}
            if r.system.startswith("neo"):
                from neo.embedding.backends import resolve_backend_name

                rec["backend"] = resolve_backend_name(args.backend, torch.device("cpu"))
            for k in mine:
                if k != "step_ms":
                    rec[k] = statistics.mean(g[k] for g in gathered)
            if r is not neo:                               # the same work: step 0's pooled outputs compared
                diffs: List[Any] = [None] * world_size
                dist.all_gather_object(diffs, float((r.first_output - neo.first_output).abs().max()), group=pg.world)
                rec["max_abs_diff_vs_neo"] = max(diffs)
            records.append(rec)
        for system, note in notes.items():
            records.append({"system": system, "sharding_type": st, "world_size": world_size, "step_ms": None, "note": note,
                            "machine": machine})
        del runners, neo, sec
    return records


def _print(records: List[Dict[str, Any]]) -> None:
    cols = ("input_dist_ms", "lookup_ms", "output_dist_ms", "forward_ms", "backward_ms")
    print(f"{'system':9} {'sharding_type':18} {'W':>2} {'step_ms':>8} " + " ".join(f"{c[:-3]:>11}" for c in cols)
          + "  max |out - neo|")
    for r in records:
        if r["step_ms"] is None:
            print(f"{r['system']:9} {r['sharding_type']:18} {r['world_size']:>2} {'-':>8} {r.get('note', '')}")
            continue
        vals = " ".join(f"{r[c]:11.1f}" if c in r else f"{'':11}" for c in cols)
        diff = f"  {r['max_abs_diff_vs_neo']:.1e}" if r.get("max_abs_diff_vs_neo") is not None else ""
        print(f"{r['system']:9} {r['sharding_type']:18} {r['world_size']:>2} {r['step_ms']:8.1f} {vals}{diff}")
    by = {(r["system"], r["sharding_type"], r["world_size"]): r["step_ms"] for r in records}
    for (system, st, W), ms in sorted(by.items()):
        other = by.get(("torchrec", st, W))
        if system.startswith("neo") and ms and other:
            print(f"W={W} {st}: TorchRec / {system} = {other / ms:.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sharded_workload_args(p, [2, 4], NEO_TYPES, batch_default=2048)
    p.add_argument("--mean-ids", type=positive_int, default=20, help="mean bag length (lengths uniform in 1 .. 2m-1)")
    p.add_argument("--backend", default="auto", help="Neo embedding backend")
    p.add_argument("--no-validate", action="store_true", help="skip Neo's id validation at the source")
    p.add_argument("--comm", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="Neo's pooled-embedding wire precision, forward and backward (system name neo-fp16 ...)")
    p.add_argument("--no-torchrec", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="tiny workload for a smoke test: --rows 1000 --batch 64 --steps 2 --warmup 1, for the flags not given")
    add_system_malloc_arg(p)
    add_no_shm_arg(p)
    add_isa_arg(p)
    p.add_argument("--json", metavar="FILE", type=json_path)
    args = p.parse_args(argv)
    if args.cw_dim > args.dim:
        p.error(f"argument --cw-dim: {args.cw_dim} is wider than --dim {args.dim}")
    apply_isa(args.isa)
    apply_quick(args, {"rows": 100_000, "batch": 2048, "steps": 10, "warmup": 3},
                {"rows": 1000, "batch": 64, "steps": 2, "warmup": 1})
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from neo.embedding.backends import resolve_backend_name

    print(f"Neo embedding backend: {resolve_backend_name(args.backend, torch.device('cpu'))}; "
          f"{args.tables} tables x {args.rows} rows, D={args.dim}, batch {args.batch}/rank, ~{args.mean_ids} ids/bag; "
          f"{args.steps} timed steps (median){'; glibc malloc defaults' if args.system_malloc else ''}")
    latency_before = memory_latency_ns()
    records = run_world_sizes(_rank_main, args, args.world_sizes)
    note_memory_latency(records, latency_before, memory_latency_ns())
    _print(records)
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
