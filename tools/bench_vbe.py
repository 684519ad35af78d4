"""Variable-batch input (TorchRec's VBE KeyedJaggedTensor): Neo's lookup of the distinct bags
against the same module on the expanded full batch and TorchRec's EmbeddingBagCollection, side
by side on the same work.

    python tools/bench_vbe.py                              # 16 tables x 500k rows, B 4096, half the features deduplicated 16x
    python tools/bench_vbe.py --threads 1,2 --iters 20 --json bench_out/vbe.json

Workload: ``--features`` tables of ``--rows`` x ``--dim`` fp32, one feature each, SGD (lr 0.01).
Half the features are "user" features deduplicated ``--dedup`` times (``B / dedup`` distinct
bags, each sample reading one of them through ``inverse_indices``: a batch of requests with
repeated users), the other half "item" features with B bags; bag lengths uniform in
[1, ``--max-len``], ids uniform in [0, rows). One VBE KJT (``torchrec.sparse.jagged_tensor``),
the same for every system.

- ``neo``: ``TableBatchedEmbedding(backend="cpu")`` on the VBE KJT: the distinct bags pooled
  once (padded to ``max_f B_f``), then each sample's row taken (neo/embedding/module.py).
- ``neo-expanded``: the same module on ``neo.sparse.expand_variable_batch(kjt)``, the expansion
  timed with it: the lookups of the full batch (what a sharded collection does today).
- ``torchrec``: TorchRec's unsharded ``EmbeddingBagCollection`` on the VBE KJT (forward only:
  its backward materializes dense (rows, D) gradients, a different job).

Also timed: ``expand_variable_batch`` itself, by ``neo._C.jagged_take`` and by torch's ops
(``expansion`` in the JSON). Phases: ``fwd`` (no autograd) and ``fwd_bwd`` (forward, backward with a fixed upstream
gradient, the fused SGD update). Iterations interleaved across the systems (alternating
order), medians reported; outputs are checked to agree before timing. Records carry the
machine (tools/bench_common.py); ``vs_neo``: the system's time over Neo's; the JSON's ``notes``
say which peer (or phase of one) is left out and why.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bench_common import (add_timing_args, multiple_of, peer_version, positive_int, quiet_peer_logs,  # noqa: E402
                                start_one_process, time_interleaved, write_json)


def _kjt(args, gen):
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    B, F = args.batch, args.features
    keys = [f"f{i}" for i in range(F)]
    strides = [max(1, B // args.dedup) if i < F // 2 else B for i in range(F)]
    lengths = torch.cat([torch.randint(1, args.max_len + 1, (n,), generator=gen) for n in strides])
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
    inverse = torch.stack([torch.randint(0, n, (B,), generator=gen) if n < B else torch.randperm(B, generator=gen)
                           for n in strides])
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, stride_per_key_per_rank=[[n] for n in strides],
                             inverse_indices=(keys, inverse)), strides


def _systems(args, kjt, gen, notes: List[str]) -> Dict[str, Callable[[bool], object]]:
    """The systems by name, each ``step(train)``; a peer left out (or a phase of one) adds a line to ``notes``."""
    import torch

    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.embedding import TableBatchedEmbedding
    from neo.sparse import expand_variable_batch

    opt = OptimizerConfig("sgd", lr=0.01)
    tables = [TableConfig(f"t{i}", args.rows, args.dim, feature_names=(f"f{i}",), optimizer=opt)
              for i in range(args.features)]
    grad = torch.randn(args.batch, args.features * args.dim, generator=gen)
    mods = {name: TableBatchedEmbedding(tables, backend="cpu", seed=1) for name in ("neo", "neo-expanded")}

    def run(name: str, make_input):
        def step(train: bool):
            if not train:
                with torch.no_grad():
                    return mods[name](make_input())
            mods[name](make_input()).backward(grad)
        return step

    systems = {"neo": run("neo", lambda: kjt), "neo-expanded": run("neo-expanded", lambda: expand_variable_batch(kjt))}
    try:
        quiet_peer_logs()
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
    except ImportError as e:
        notes.append(f"torchrec left out: not importable ({type(e).__name__}: {e})")
        return systems
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                                                            feature_names=list(t.feature_names)) for t in tables])
    with torch.no_grad():
        for t in tables:
            ebc.embedding_bags[t.name].weight.copy_(mods["neo"].table_weight(t.name))

    def torchrec(train: bool):
        if train:
            return None                                      # forward only (module doc)
        with torch.no_grad():
            return ebc(kjt).values()

    systems["torchrec"] = torchrec
    notes.append("torchrec fwd_bwd left out: its backward materializes dense (rows, D) gradients, "
                 "a different job (forward only)")
    return systems


def _time_expansion(kjt, iters: int) -> Dict[str, float]:
    """Median ms of ``expand_variable_batch(kjt)`` by neo._C's jagged take and by torch's ops
    (the path without the extension), one thread."""
    import torch

    import neo.cpp
    from neo.sparse import expand_variable_batch

    torch.set_num_threads(1)
    real, out = neo.cpp.cpu_kernels, {}
    for name, kernels in (("jagged_take_ms", real), ("torch_ops_ms", lambda op: None)):
        neo.cpp.cpu_kernels = kernels
        try:
            ts = []
            for _ in range(iters + 1):
                t0 = time.perf_counter()
                expand_variable_batch(kjt)
                ts.append(time.perf_counter() - t0)
            out[name] = round(statistics.median(ts[1:]) * 1e3, 3)
        finally:
            neo.cpp.cpu_kernels = real
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--features", type=positive_int, default=16)
    p.add_argument("--rows", type=positive_int, default=500_000)
    p.add_argument("--dim", type=multiple_of(4), default=64, help="embedding dim (a positive multiple of 4)")
    p.add_argument("--batch", type=positive_int, default=4096)
    p.add_argument("--dedup", type=positive_int, default=16, help="user features: B / dedup distinct bags")
    p.add_argument("--max-len", type=positive_int, default=20)
    add_timing_args(p)
    args = p.parse_args(argv)
    machine = start_one_process(args)
    import torch

    gen = torch.Generator().manual_seed(0)
    kjt, strides = _kjt(args, gen)
    print(f"workload: {args.features} tables x {args.rows} rows x D {args.dim} fp32, B {args.batch}; "
          f"{args.features // 2} features with {strides[0]} distinct bags, {args.features - args.features // 2} "
          f"with {args.batch}; {kjt.values().numel()} ids in the KJT, SGD")
    notes: List[str] = []
    systems = _systems(args, kjt, gen, notes)
    for note in notes:
        print(note)
    with torch.no_grad():                                    # the same outputs before timing
        ref = systems["neo"](False)
        for name, fn in systems.items():
            torch.testing.assert_close(fn(False), ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    records: List[Dict] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for phase, train in (("fwd", False), ("fwd_bwd", True)):
            names = [s for s in systems if not (train and s == "torchrec")]
            times = time_interleaved({s: functools.partial(systems[s], train) for s in names}, args.warmup, args.iters)
            for s, ts in times.items():
                records.append({"system": s, "phase": phase, "threads": threads,
                                "ms": round(statistics.median(ts.wall) * 1e3, 3), "batch": args.batch,
                                "features": args.features, "rows": args.rows, "dim": args.dim, "dedup": args.dedup,
                                "kjt_ids": int(kjt.values().numel()), "machine": machine,
                                "peer_version": peer_version("torchrec") if s == "torchrec" else None})
    expansion = _time_expansion(kjt, args.iters)
    print(f"expand_variable_batch: {expansion['jagged_take_ms']:.2f} ms by neo._C.jagged_take, "
          f"{expansion['torch_ops_ms']:.2f} ms by torch's ops (one thread, median of {args.iters})")
    print(f"\n{'system':13} {'threads':>7} {'phase':8} {'ms':>9} {'vs neo':>7}")
    for r in records:
        neo = next(x for x in records if x["system"] == "neo" and x["phase"] == r["phase"]
                   and x["threads"] == r["threads"])
        r["vs_neo"] = round(r["ms"] / neo["ms"], 3)
        print(f"{r['system']:13} {r['threads']:>7} {r['phase']:8} {r['ms']:>9.2f} {r['vs_neo']:>6.2f}x")
    if args.json:
        write_json(args.json, {"records": records, "expansion": dict(expansion, machine=machine), "notes": notes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
