"""Unpooled (sequence) embedding lookups: Neo's ``emb.sequence`` against FBGEMM's CPU TBE with
``PoolingMode.NONE`` and plain PyTorch, side by side on the same work.

    python tools/bench_sequence.py                         # 4 tables x 1M rows, D 64, 1024 samples x 50 ids
    python tools/bench_sequence.py --threads 1,2 --iters 20 --json bench_out/sequence.json
    python tools/bench_sequence.py --isa avx2              # every system capped at AVX2

Workload: ``--tables`` tables of ``--rows`` x ``--dim`` fp32, one feature each; every sample has
``--seq-len`` ids per feature (a history), uniform in [0, rows); row-wise Adagrad (lr 0.05, eps
1e-8). The same upstream gradient (one fixed random tensor per table) for every system.

- ``neo``: ``TableBatchedEmbedding(tables, backend="cpu")`` with input validation on;
  ``emb.sequence(batch)`` (neo/embedding/sequence.py), the fused update in its backward.
- ``fbgemm``: ``SplitTableBatchedEmbeddingBagsCodegen`` (HOST / CPU, ``PoolingMode.NONE``,
  ``EXACT_ROWWISE_ADAGRAD``), skipped with a note where fbgemm_gpu is not importable.
- ``torch``: one ``nn.Embedding(sparse=True)`` a table and ``torch.optim.Adagrad`` (per-element
  Adagrad, the closest stock PyTorch has; it does more work per row).

Neo and FBGEMM start from the same weights and apply the same update rule: after the timed
steps their tables are compared (``max_abs_diff_vs_neo`` in the JSON). Phases: ``fwd``
(no autograd) and ``fwd_bwd`` (forward, backward, update); iterations interleaved across the
systems, median reported. Records carry the machine (tools/bench_common.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import warnings
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bench_common import (add_timing_args, multiple_of, positive_int, start_one_process,  # noqa: E402
                                time_interleaved, write_json)


def _systems(args, B: int, gen):
    import torch

    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.embedding import TableBatchedEmbedding
    from neo.sparse import KeyedJaggedBatch

    T, R, D, L = args.tables, args.rows, args.dim, args.seq_len
    opt = OptimizerConfig("rowwise_adagrad", lr=0.05, eps=1e-8)
    tables = [TableConfig(f"t{i}", R, D, feature_names=(f"f{i}",), optimizer=opt) for i in range(T)]
    emb = TableBatchedEmbedding(tables, backend="cpu", seed=1)
    ids = [torch.randint(0, R, (B * L,), generator=gen) for _ in range(T)]
    batch = KeyedJaggedBatch(tuple(f"f{i}" for i in range(T)), torch.cat(ids), torch.full((T * B,), L), B)
    grads = [torch.randn(B * L, D, generator=gen) for _ in range(T)]

    def neo(train: bool):
        if not train:
            with torch.no_grad():
                return emb.sequence(batch)
        seq = emb.sequence(batch)
        sum((s.values * g).sum() for s, g in zip(seq.values(), grads)).backward()

    systems: Dict[str, Callable[[bool], object]] = {"neo": neo}
    weights = {"neo": lambda: [emb.table_weight(t.name) for t in tables]}
    notes: List[str] = []
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice, EmbeddingLocation,
                                                                           SplitTableBatchedEmbeddingBagsCodegen)

        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(R, D, EmbeddingLocation.HOST, ComputeDevice.CPU) for _ in range(T)],
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.05, eps=1e-8,
            pooling_mode=PoolingMode.NONE)
        for t, w in enumerate(tbe.split_embedding_weights()):
            w.copy_(emb.table_weight(tables[t].name))
        indices = torch.cat(ids)
        offsets = torch.arange(0, T * B * L + 1, L, dtype=torch.int64)          # T x B samples of L ids
        grad_all = torch.cat(grads)

        def fbgemm(train: bool):
            if not train:
                with torch.no_grad():
                    return tbe(indices, offsets)
            tbe(indices, offsets).backward(grad_all)

        systems["fbgemm"] = fbgemm
        weights["fbgemm"] = lambda: list(tbe.split_embedding_weights())
    except Exception as e:  # noqa: BLE001 - a peer that is not installed is a note, not a failure
        notes.append(f"fbgemm skipped: {type(e).__name__}: {e}")

    warnings.filterwarnings("ignore", message="Sparse invariant checks")   # torch's Adagrad on sparse grads
    mods = [torch.nn.Embedding(R, D, sparse=True) for _ in range(T)]
    for m, t in zip(mods, tables):
        m.weight.data.copy_(emb.table_weight(t.name))
    torch_opt = torch.optim.Adagrad([m.weight for m in mods], lr=0.05, eps=1e-8)

    def plain(train: bool):
        if not train:
            with torch.no_grad():
                return [m(i) for m, i in zip(mods, ids)]
        torch_opt.zero_grad()
        sum((m(i) * g).sum() for m, i, g in zip(mods, ids, grads)).backward()
        torch_opt.step()

    systems["torch"] = plain
    return systems, weights, notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=positive_int, default=4)
    p.add_argument("--rows", type=positive_int, default=1_000_000)
    p.add_argument("--dim", type=multiple_of(4), default=64, help="embedding dim (a positive multiple of 4)")
    p.add_argument("--batch", type=positive_int, default=1024)
    p.add_argument("--seq-len", type=positive_int, default=50)
    add_timing_args(p)
    args = p.parse_args(argv)
    machine = start_one_process(args)
    import torch

    print(f"workload: {args.tables} tables x {args.rows} rows x D {args.dim} fp32, {args.batch} samples x "
          f"{args.seq_len} ids a table ({args.tables * args.batch * args.seq_len} ids a step), row-wise Adagrad")
    systems, weights, notes = _systems(args, args.batch, torch.Generator().manual_seed(0))
    for n in notes:
        print(n)
    records = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for phase, train in (("fwd", False), ("fwd_bwd", True)):
            times = time_interleaved({s: functools.partial(fn, train) for s, fn in systems.items()},
                                     args.warmup, args.iters)
            for s, ts in times.items():
                ms = statistics.median(ts.wall) * 1e3
                records.append({"system": s, "phase": phase, "threads": threads, "ms": round(ms, 3),
                                "ids_per_s": round(args.tables * args.batch * args.seq_len / (ms / 1e3)),
                                **{k: getattr(args, k) for k in ("tables", "rows", "dim", "batch", "seq_len")},
                                "machine": machine})
    neo_w = weights["neo"]()
    for r in records:                 # every system took the same number of update steps
        if r["system"] == "fbgemm" and r["phase"] == "fwd_bwd":
            r["max_abs_diff_vs_neo"] = float(max((a - b).abs().max() for a, b in zip(neo_w, weights["fbgemm"]())))
    print(f"\n{'system':8} {'threads':>7} {'phase':8} {'ms':>9} {'M ids/s':>8}")
    for r in records:
        print(f"{r['system']:8} {r['threads']:>7} {r['phase']:8} {r['ms']:>9.2f} {r['ids_per_s'] / 1e6:>8.2f}")
    print("\nother / neo (time ratio; > 1: Neo faster)")
    for r in records:
        if r["system"] == "neo":
            continue
        neo = next(x for x in records if x["system"] == "neo" and x["phase"] == r["phase"]
                   and x["threads"] == r["threads"])
        r["vs_neo"] = round(r["ms"] / neo["ms"], 3)
        extra = f"  (tables after the run: max |fbgemm - neo| {r['max_abs_diff_vs_neo']:.2e})" \
            if "max_abs_diff_vs_neo" in r else ""
        print(f"  {r['system']:6} threads={r['threads']} {r['phase']:8} {r['vs_neo']:.2f}x{extra}")
    if args.json:
        write_json(args.json, {"records": records, "notes": notes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
