"""Inference of a whole DLRM, tables included: eager and as a ``torch.export`` program, Neo's and plain PyTorch's.

    python tools/bench_export.py                          # 26 tables of 100k rows, D 128, B 2048, 1 thread
    python tools/bench_export.py --quick                  # small shapes, a smoke test
    python tools/bench_export.py --threads 1,2 --json bench_out/export.json

The work: the logits of one batch (no gradient), MLPerf DLRM's dense sizes (bottom 13-512-256-128,
top 1024-1024-512-256-1) over F tables of ``--rows`` rows, one feature each, D = 128, bags of
``--pooling`` ids (1: one-hot, as MLPerf's Criteo), ids uniform. Systems, same weights and batches:

- ``neo``: :class:`neo.models.DLRM` over a ``TableBatchedEmbedding`` (CPU kernels), eval mode;
- ``neo-exported``: that model through ``neo.export.export`` (batch and ids dynamic), its
  program's ``module()`` called (the lookup the op ``neo::pooled_lookup``);
- ``torch``: the same model in plain PyTorch: one ``nn.EmbeddingBag(mode="sum")`` per table called
  with its feature's ids and offsets, ``nn.Linear`` + ``nn.ReLU``, the interaction as one ``bmm``
  (``DotInteraction(kernel="torch")``).

Before timing, ``neo-exported``'s logits must equal ``neo``'s bit for bit and ``torch``'s within
fp32 tolerance (the tool exits naming the system otherwise). Systems alternate
(``bench_common.time_interleaved``), each call on the next of 8 pre-drawn batches; medians over
``--iters``. Prints ms per batch and ratios; ``--json`` writes the records with the machine (CPU
model, ISA) and the export time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from bench_common import positive_int, start_one_process, time_interleaved, write_json  # noqa: E402

DEFAULTS = dict(batch=2048, features=26, rows=100_000, dim=128, pooling=1, bottom=[512, 256, 128],
                top=[1024, 1024, 512, 256, 1])
QUICK = dict(batch=128, features=4, rows=1000, dim=16, pooling=3, bottom=[32, 16], top=[32, 1])
TOLERANCE = 1e-4
BATCHES = 8


def parse_args(argv=None) -> argparse.Namespace:
    from bench_compile import add_model_args, parse_model_args

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, features_help="F tables, one feature each")
    p.add_argument("--rows", type=positive_int, default=None, help="rows of each table")
    p.add_argument("--pooling", type=positive_int, default=None, help="ids per bag")
    return parse_model_args(p, argv, DEFAULTS, QUICK)


def plain_model(model, args):
    """The same function as ``model`` in plain PyTorch, on copies of its weights."""
    import torch
    from torch import nn

    from bench_compile import plain_head

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.tables = nn.ModuleList()
            for f in range(args.features):
                bag = nn.EmbeddingBag(args.rows, args.dim, mode="sum")
                with torch.no_grad():
                    bag.weight.copy_(model.embedding.table_weight(f"t{f}"))
                self.tables.append(bag)
            self.head = plain_head(model)

        def forward(self, dense, pieces):          # pieces: per table (ids, offsets)
            pooled = torch.cat([bag(ids, offsets) for bag, (ids, offsets) in zip(self.tables, pieces)], dim=1)
            return self.head(dense, pooled)

    return Plain().eval()


def make_batches(args):
    import torch

    from neo.sparse import KeyedJaggedBatch

    gen = torch.Generator().manual_seed(1)
    keys = tuple(f"t{f}" for f in range(args.features))
    out = []
    for _ in range(BATCHES):
        B, n = args.batch, args.batch * args.pooling
        ids = torch.randint(0, args.rows, (args.features * n,), generator=gen)
        kjt = KeyedJaggedBatch(keys, ids, torch.full((args.features * B,), args.pooling), B)
        offsets = torch.arange(0, n, args.pooling)
        pieces = [(ids[f * n:(f + 1) * n], offsets) for f in range(args.features)]
        out.append((torch.randn(B, 13, generator=gen), kjt, pieces))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = start_one_process(args)
    import torch

    import neo.export
    from neo.config.embedding import TableConfig
    from neo.embedding import TableBatchedEmbedding
    from neo.models import DLRM

    torch.manual_seed(0)
    tables = [TableConfig(f"t{f}", args.rows, args.dim) for f in range(args.features)]
    model = DLRM(TableBatchedEmbedding(tables, backend="cpu"), args.features, args.dim, 13, args.bottom,
                 args.top).eval()
    plain = plain_model(model, args)
    batches = make_batches(args)
    t0 = time.perf_counter()
    program = neo.export.export(model, batches[0][:2]).module()
    export_s = time.perf_counter() - t0
    systems = {"neo": lambda d, k, p: model(d, k), "neo-exported": lambda d, k, p: program(d, k),
               "torch": lambda d, k, p: plain(d, p)}
    with torch.no_grad():
        want = model(*batches[1][:2])
        for name, fn in systems.items():
            got = fn(*batches[1])
            err = (got - want).abs().max().item()
            if (name == "neo-exported" and not torch.equal(got, want)) or err > TOLERANCE * want.abs().max().item():
                raise SystemExit(f"{name}: logits differ from neo's by {err:.3g}")
    records = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        run = {}
        for name, fn in systems.items():
            turn = [0]

            def call(fn=fn, turn=turn):
                turn[0] += 1
                with torch.no_grad():
                    return fn(*batches[turn[0] % BATCHES])

            run[name] = call
        times = time_interleaved(run, args.warmup, args.iters)
        base = statistics.median(times["torch"].wall)
        for name in systems:
            ms = statistics.median(times[name].wall) * 1e3
            records.append(dict(system=name, threads=threads, batch=args.batch, features=args.features,
                                rows=args.rows, dim=args.dim, pooling=args.pooling, bottom=args.bottom, top=args.top,
                                ms=ms, torch_over_system=base * 1e3 / ms, export_s=export_s, iters=args.iters,
                                machine=machine))
    print(f"{'system':<14}{'threads':>8}{'ms/batch':>10}{'torch / system':>16}")
    for r in records:
        print(f"{r['system']:<14}{r['threads']:>8}{r['ms']:>10.2f}{r['torch_over_system']:>15.2f}x")
    for threads in args.threads:
        by = {r["system"]: r["ms"] for r in records if r["threads"] == threads}
        print(f"threads={threads}: neo / neo-exported {by['neo'] / by['neo-exported']:.3f}x (> 1: exported faster); "
              f"torch / neo-exported {by['torch'] / by['neo-exported']:.2f}x; export took {export_s:.1f} s")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
