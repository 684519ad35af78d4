"""What per-id weights cost a lookup, and Neo's position weights against TorchRec's.

    python tools/bench_position_weights.py                          # one rank-batch of the main job's shape
    python tools/bench_position_weights.py --bag 4 --json bench_out/pw.json

Workload: ``--features`` one-table features of ``--rows`` x ``--dim`` fp32 rows (SGD), ``--batch``
samples, every bag ``--bag`` ids (the main job at 2 ranks: 8 features, 16 dims, 2048 samples a
rank-batch, one id a bag). Systems, each a call timed in turn (bench_common.time_interleaved):

- ``lookup``: a ``TableBatchedEmbedding`` (cpu backend) forward + backward, no weights;
- ``lookup+weights``: the same with per-id weights that need no gradient;
- ``lookup+learnable``: with weights that require grad (their gradient computed too);
- ``lookup+position``: ``neo.embedding.PositionWeights`` (max_length ``--bag``) then the lookup;
- ``position``: ``PositionWeights`` alone, forward + backward of its weights (``table_index`` and
  the table's read); ``position.table_index``: the slots alone;
- ``position.torch``, ``position.table_index.torch``: the same through the module's torch
  operations (its path on a GPU, under tracing or ``torch.func``) instead of ``neo._C``'s loops;
  before timing, the two paths' weights must be equal;
- ``torchrec.position``: TorchRec's ``PositionWeightedModuleCollection`` alone, forward + backward
  of its weights (the peer of ``position``), started from Neo's weights; skipped with a note where
  TorchRec is not importable. Before timing, its weights must equal Neo's.

Output: a table (median ms) and, with ``--json``, records with ``system``, ``threads``, ``ids``,
``ms``, ``vs_lookup`` (this over ``lookup``), ``vs_torchrec`` (TorchRec's ``position`` over this,
for ``position``) and ``machine``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
import torch  # noqa: E402

from bench_common import add_timing_args, peer_version, positive_int, start_one_process, time_interleaved, write_json  # noqa: E402,E501


def torch_operations(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with ``PositionWeights`` on its torch operations (no ``neo._C`` loops)."""
    from neo.embedding import position_weights

    def run():
        kernels = position_weights._kernels
        position_weights._kernels = lambda t: None
        try:
            return call()
        finally:
            position_weights._kernels = kernels
    return run


def systems(args) -> Dict[str, Callable[[], Any]]:
    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.embedding import PositionWeights, TableBatchedEmbedding
    from neo.sparse import KeyedJaggedBatch

    F, B = args.features, args.batch
    keys = tuple(f"f{k}" for k in range(F))
    gen = torch.Generator().manual_seed(0)
    lengths = torch.full((F * B,), args.bag, dtype=torch.int64)
    values = torch.randint(0, args.rows, (F * B * args.bag,), generator=gen)
    emb = TableBatchedEmbedding([TableConfig(f"t{k}", args.rows, args.dim, (f"f{k}",),
                                             optimizer=OptimizerConfig("sgd", lr=0.01)) for k in range(F)], backend="cpu")
    grad = torch.randn(B, F * args.dim, generator=gen)
    plain = KeyedJaggedBatch(keys, values, lengths, B)
    fixed = KeyedJaggedBatch(keys, values, lengths, B, weights=torch.rand(values.numel(), generator=gen) + 0.5)
    learn = KeyedJaggedBatch(keys, values, lengths, B, weights=fixed.weights.clone().requires_grad_())
    pw = PositionWeights({k: args.bag for k in keys})
    with torch.no_grad():
        for p in pw.parameters():
            p.uniform_(0.5, 1.5, generator=gen)
    scale = torch.randn(values.numel(), generator=gen)
    out: Dict[str, Callable[[], Any]] = {
        "lookup": lambda: emb(plain).backward(grad),
        "lookup+weights": lambda: emb(fixed).backward(grad),
        "lookup+learnable": lambda: emb(learn).backward(grad),
        "lookup+position": lambda: emb(pw(plain)).backward(grad),
        "position": lambda: (pw(plain).weights * scale).sum().backward(),
        "position.table_index": lambda: pw.table_index(plain),
        "position.torch": torch_operations(lambda: (pw(plain).weights * scale).sum().backward()),
        "position.table_index.torch": torch_operations(lambda: pw.table_index(plain)),
    }
    kernels, ops = pw(plain).weights.detach(), torch_operations(lambda: pw(plain).weights.detach())()
    if not torch.equal(kernels, ops):
        raise AssertionError(f"PositionWeights' two paths differ by {float((kernels - ops).abs().max())}")
    if peer_version("torchrec", "fbgemm_gpu") is not None:
        from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection

        theirs = PositionWeightedModuleCollection({k: args.bag for k in keys})
        with torch.no_grad():
            for k in keys:
                theirs.position_weights[k].copy_(pw.weights[k])
        kjt = plain.to_torchrec()
        mine = pw(plain).weights.detach()
        got = theirs(kjt).weights().detach()
        if not torch.equal(got, mine):
            raise AssertionError(f"TorchRec's position weights differ from Neo's by {float((got - mine).abs().max()):.6g}")
        out["torchrec.position"] = lambda: (theirs(kjt).weights() * scale).sum().backward()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", type=positive_int, default=8)
    p.add_argument("--batch", type=positive_int, default=2048)
    p.add_argument("--bag", type=positive_int, default=1, help="ids a bag (and the position weights' max_length)")
    p.add_argument("--rows", type=positive_int, default=3000)
    p.add_argument("--dim", type=positive_int, default=16)
    add_timing_args(p, iters=300, warmup=20)
    args = p.parse_args(argv)
    machine = start_one_process(args)
    calls = systems(args)
    if "torchrec.position" not in calls:
        print("note: torchrec / fbgemm_gpu not importable: no torchrec.position")
    ids = args.features * args.batch * args.bag
    records: List[Dict[str, Any]] = []
    prev = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            timed = time_interleaved(calls, args.warmup, args.iters)
            ms = {k: 1e3 * statistics.median(t.wall) for k, t in timed.items()}
            for name in calls:
                rec = {"system": name, "threads": threads, "ids": ids, "ms": round(ms[name], 4),
                       "vs_lookup": round(ms[name] / ms["lookup"], 3), "vs_torchrec": None, "machine": machine}
                if name == "position" and "torchrec.position" in ms:
                    rec["vs_torchrec"] = round(ms["torchrec.position"] / ms[name], 2)
                records.append(rec)
    finally:
        torch.set_num_threads(prev)
    print(f"{ids:,} ids ({args.features} features x {args.batch} samples x {args.bag} a bag), D {args.dim}")
    print(f"{'system':26} {'threads':>7} {'ms':>9} {'/ lookup':>9} {'torchrec / this':>16}")
    for r in records:
        vs = f"{r['vs_torchrec']:.2f}x" if r["vs_torchrec"] is not None else "-"
        print(f"{r['system']:26} {r['threads']:7} {r['ms']:9.3f} {r['vs_lookup']:8.2f}x {vs:>16}")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
