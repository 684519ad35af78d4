"""Sharded unpooled (sequence) lookups: Neo's ``ShardedEmbeddingCollection.sequence`` against
TorchRec's sharded ``EmbeddingCollection`` (DistributedModelParallel), CPU, gloo, side by side.

    python tools/bench_sequence_sharded.py                          # W 2: table_wise, column_wise, data_parallel, row_wise
    python tools/bench_sequence_sharded.py --types table_wise --steps 20 --json bench_out/seq_sharded.json
    python tools/bench_sequence_sharded.py --quick                  # smoke run (seconds)

Workload (defaults): 8 tables of 100k rows, D 64, fp32, one feature each; every sample has
``--seq-len`` ids per feature (a history; 20), uniform; batch 1024 per rank; fused SGD (lr 0.01);
one training step = the sharded unpooled lookup, backward with a fixed random upstream gradient
(one per feature) and the fused update; no dense layers.

- ``neo``: ``ShardedEmbeddingCollection(tables, even_plan(...)).sequence(batch)``
  (neo/distributed/sequence.py), ids validated at the source.
- ``torchrec``: ``EmbeddingCollection`` sharded by ``DistributedModelParallel`` with
  ``EmbeddingCollectionSharder`` (fused ``EXACT_SGD``), its planner forced to the same sharding
  type by ``ParameterConstraints``. On CPU it runs table_wise and column_wise; not row_wise, and
  its data_parallel ``EmbeddingCollection`` fails there (TorchRec 1.8.0: the replica's lookup
  returns one row per bag, and ``construct_jagged_tensors`` raises ``split_with_sizes expects
  split_sizes to sum exactly to ...``), so Neo runs alone in those two (TorchRec's absence a note
  record in each). Skipped with a note where torchrec / fbgemm_gpu are not importable.

Both systems start from the same tables (Neo's weights copied into TorchRec's shards) and, after
the timed steps, their tables are compared (``max_abs_diff_vs_neo``: the same SGD on the same
ids and gradients). Steps interleave (step i of Neo, then of TorchRec), a barrier before each;
per system the median step over ``--steps`` after ``--warmup``, the slowest rank's (``step_ms``),
and its ``forward_ms`` (the lookup up to the rows on their ranks) and ``backward_ms`` (to the
updated tables), medians averaged over ranks. Runs in one
spawned gloo group per world size (tests/multiprocess.py), one torch thread a process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench_common import (add_isa_arg, apply_isa, machine_info, quiet_peer_logs, run_world_sizes,  # noqa: E402
                          shard_torchrec, start_rank, torchrec_table_blocks, write_json)
from bench_common import add_sharded_workload_args, apply_quick, json_path, positive_int  # noqa: E402

NEO_TYPES = ("table_wise", "column_wise", "data_parallel", "row_wise")
TORCHREC_TYPES = ("table_wise", "column_wise")


def _batches(args, rank: int, n: int = 3):
    from neo.sparse import KeyedJaggedBatch

    gen = torch.Generator().manual_seed(100 + rank)
    keys = tuple(f"f{t}" for t in range(args.tables))
    lengths = torch.full((args.tables * args.batch,), args.seq_len)
    return [KeyedJaggedBatch(keys, torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen), lengths,
                             args.batch) for _ in range(n)]


def _grads(args, rank: int) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(7 + rank)
    return [torch.randn(args.batch * args.seq_len, args.dim, generator=gen) for _ in range(args.tables)]


def _neo(args, st: str, pg):
    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.distributed import ShardedEmbeddingCollection, even_plan

    tables = [TableConfig(f"t{t}", args.rows, args.dim, feature_names=(f"f{t}",),
                          optimizer=OptimizerConfig("sgd", lr=0.01)) for t in range(args.tables)]
    plan = even_plan(tables, {t.name: st for t in tables}, pg.world_size, pg.local_world_size,
                     column_shards=args.dim // args.cw_dim)
    sec = ShardedEmbeddingCollection(tables, plan, pg, backend="auto", seed=1)
    batches, grads = _batches(args, pg.rank), _grads(args, pg.rank)

    def step(i: int) -> Dict[str, float]:
        t0 = time.perf_counter()
        seq = sec.sequence(batches[i % len(batches)])
        t1 = time.perf_counter()
        sum((s.values * g).sum() for s, g in zip(seq.values(), grads)).backward()
        return {"forward_ms": t1 - t0, "backward_ms": time.perf_counter() - t1}

    return sec, step


def _torchrec(args, st: str, pg, weights: Dict[str, torch.Tensor]):
    quiet_peer_logs()
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder

    ec = EmbeddingCollection(tables=[EmbeddingConfig(name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows,
                                                     feature_names=[f"f{t}"]) for t in range(args.tables)],
                             device=torch.device("meta"))
    model = shard_torchrec(ec, EmbeddingCollectionSharder, st, args.cw_dim, pg, weights)
    kjts = [b.to_torchrec() for b in _batches(args, pg.rank)]
    grads = _grads(args, pg.rank)

    def step(i: int) -> Dict[str, float]:
        t0 = time.perf_counter()
        out = model(kjts[i % len(kjts)]).wait()
        t1 = time.perf_counter()
        sum((out[f"f{t}"].values() * g).sum() for t, g in enumerate(grads)).backward()
        return {"forward_ms": t1 - t0, "backward_ms": time.perf_counter() - t1}

    return model, step


def _max_diff(model, weights: Dict[str, torch.Tensor]) -> float:
    return max(float((blk - mine).abs().max()) for blk, mine in torchrec_table_blocks(model, weights))


def _rank_main(rank: int, world_size: int, args) -> List[Dict[str, Any]]:
    import datetime

    from neo.distributed import ProcessGroups

    start_rank(args.threads, False)
    machine = machine_info(args.isa)
    pg = ProcessGroups.build(world_size, timeout=datetime.timedelta(seconds=300))
    records = []
    for st in args.types:
        sec, neo_step = _neo(args, st, pg)
        runners = {"neo": neo_step}
        note, model = None, None
        if not args.no_torchrec and st not in TORCHREC_TYPES:
            note = f"left out: TorchRec does not run {st} on CPU (module doc; only {', '.join(TORCHREC_TYPES)})"
        elif not args.no_torchrec:
            try:
                model, runners["torchrec"] = _torchrec(args, st, pg, sec.full_weights())
            except ImportError as e:
                note = f"skipped: {type(e).__name__}: {e}"
        times: Dict[str, Dict[str, List[float]]] = {k: {} for k in runners}
        for i in range(args.warmup + args.steps):
            for name, step in runners.items():
                dist.barrier(group=pg.world)
                t0 = time.perf_counter()
                phases = step(i)
                phases["step_ms"] = time.perf_counter() - t0
                if i >= args.warmup:
                    for k, v in phases.items():
                        times[name].setdefault(k, []).append(v)
        diff = _max_diff(model, sec.full_weights()) if model is not None else None
        for name, ts in times.items():
            mine = {k: 1e3 * statistics.median(v) for k, v in ts.items()}
            gathered: List[Any] = [None] * world_size
            dist.all_gather_object(gathered, mine, group=pg.world)
            rec = {"system": name, "sharding_type": st, "world_size": world_size,
                   "step_ms": max(g["step_ms"] for g in gathered),
                   "forward_ms": statistics.mean(g["forward_ms"] for g in gathered),
                   "backward_ms": statistics.mean(g["backward_ms"] for g in gathered),
                   "steps": args.steps, "machine": machine}
            if name == "torchrec":
                diffs: List[Any] = [None] * world_size
                dist.all_gather_object(diffs, diff, group=pg.world)
                rec["max_abs_diff_vs_neo"] = max(diffs)
            records.append(rec)
        if note:
            records.append({"system": "torchrec", "sharding_type": st, "world_size": world_size, "step_ms": None,
                            "note": note, "machine": machine})
        del runners, sec, model
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sharded_workload_args(p, [2], NEO_TYPES, batch_default=1024)
    p.add_argument("--seq-len", type=positive_int, default=20, help="ids per sample and feature")
    p.add_argument("--no-torchrec", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="tiny workload for a smoke test: --rows 1000 --batch 32 --steps 2 --warmup 1, for the flags not given")
    add_isa_arg(p)
    p.add_argument("--json", metavar="FILE", type=json_path)
    args = p.parse_args(argv)
    if args.cw_dim > args.dim:
        p.error(f"argument --cw-dim: {args.cw_dim} is wider than --dim {args.dim}")
    apply_isa(args.isa)
    apply_quick(args, {"rows": 100_000, "batch": 1024, "steps": 10, "warmup": 3},
                {"rows": 1000, "batch": 32, "steps": 2, "warmup": 1})
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    print(f"{args.tables} tables x {args.rows} rows, D={args.dim}, {args.batch} samples/rank x {args.seq_len} ids "
          f"a feature, fused SGD; {args.steps} timed steps (median)")
    records = run_world_sizes(_rank_main, args, args.world_sizes)
    print(f"{'system':9} {'sharding_type':14} {'W':>2} {'step_ms':>8} {'forward':>8} {'backward':>8}  max |w - neo|")
    for r in records:
        if r["step_ms"] is None:
            print(f"{r['system']:9} {r['sharding_type']:14} {r['world_size']:>2} {'-':>8}  {r['note']}")
            continue
        extra = f"{r['max_abs_diff_vs_neo']:.1e}" if r.get("max_abs_diff_vs_neo") is not None else ""
        print(f"{r['system']:9} {r['sharding_type']:14} {r['world_size']:>2} {r['step_ms']:8.1f} "
              f"{r['forward_ms']:8.1f} {r['backward_ms']:8.1f}  {extra}")
    by = {(r["system"], r["sharding_type"], r["world_size"]): r["step_ms"] for r in records}
    for (system, st, W), ms in sorted(by.items()):
        other = by.get(("torchrec", st, W))
        if system == "neo" and ms and other:
            print(f"W={W} {st}: TorchRec / neo = {other / ms:.2f}x")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
