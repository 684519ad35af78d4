"""What ``neo calibrate`` measures, with Neo's own kernels, collectives and trainer.

Every rank runs the same measurement at the same time (a barrier before each), so that ranks
sharing the machine's cores and memory bandwidth are measured as they will train; each record
is the median of a few repetitions, averaged over the ranks by the caller.

- :func:`lookups`: ``TableBatchedEmbedding`` forward and fused backward + optimizer on one
  table, over dims, pooling factors and table sizes (from cache-sized to far larger);
- :func:`collectives`: Neo's AlltoAll (through the transport training uses: shared memory, gloo
  or NCCL) and the dense gradients' AllReduce, over message sizes;
- :func:`dense`: MLP layers forward + backward, the dot interaction, the dense optimizer;
- :func:`cache`: a cached table's admissions and row moves (``TableCache.prefetch``) over a
  memory-mapped store, on a Zipf stream, at several cache and batch sizes;
- :func:`machinery`: a small model trained by the real :class:`neo.train.trainer.Trainer` for the
  per-step costs no kernel shows (launches, bookkeeping, the loop); at W > 1 once more under each
  sharding kind of :data:`KINDS`, for the kind's overhead over table-wise.

:func:`machinery`, :func:`loading` (the data loader's work per batch), their cases and constants
live in :mod:`neo.calibrate.small_model` and are re-exported here.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from neo.calibrate.small_model import (KIND_BATCH, KIND_TABLES_PER_RANK, KINDS, WIDE_BATCH, WIDE_DIM,
                                       WIDE_IDS_PER_BAG, WIDE_TABLES_PER_RANK, loading, loading_cases,
                                       machinery, machinery_config)

__all__ = ["CacheEvictor", "timed", "cache", "cache_cases", "largest_footprint", "lookup_cases", "lookup_rows",
           "lookups", "collectives", "dense", "machinery", "loading", "loading_cases", "machinery_config", "KINDS",
           "KIND_TABLES_PER_RANK", "KIND_BATCH", "WIDE_TABLES_PER_RANK", "WIDE_DIM", "WIDE_BATCH", "WIDE_IDS_PER_BAG",
           "CACHE_SKEW"]


def timed(fn: Callable[[], Any], reps: int, group=None, warmup: int = 2,
          setup: Optional[Callable[[], Any]] = None, cpu: bool = False) -> float:
    """Median seconds of ``fn(setup())`` (or ``fn()``) over ``reps`` runs after ``warmup``; ``setup``
    runs untimed before each (barrier first when ``group``).

    ``cpu``: the process's CPU seconds instead of the wall clock's, for compute (a kernel, a
    layer) on one rank. The cost model wants compute as it costs a rank on cores of its own and
    adds the sharing of a node's cores itself (``neo.planner.step_model.cpu_bound_step``); with
    more ranks than cores a call of a few milliseconds is almost always descheduled for part of
    its run, so even the median wall time holds the sharing (on a 2-core Xeon at 4 ranks the
    wall-clock constants came out 1.5-2x slower than at 2: dense flops 0.60x, hot update
    bandwidth 0.65x, and the 4-rank steps were predicted at 1.3-1.7x their measured time). Only
    with one torch thread: with more, the process's CPU seconds are several threads' and the
    wall clock is kept."""
    call = (lambda: fn(setup())) if setup is not None else fn
    for _ in range(warmup):
        call()
    if group is not None and dist.get_world_size(group) > 1:
        dist.barrier(group=group)
    clock = time.process_time if cpu and torch.get_num_threads() == 1 else time.perf_counter
    ts = []
    for _ in range(reps):
        arg = setup() if setup is not None else None
        t0 = clock()
        fn(arg) if setup is not None else fn()
        ts.append(clock() - t0)
    ts.sort()
    return ts[len(ts) // 2]


class CacheEvictor:
    """Writes a buffer of ``nbytes`` (a few times the last-level cache): after it, a kernel finds
    its table, ids and code in memory, not in the caches, as it does in a training step, where the
    other tables, the dense layers and the collectives pass through the caches between two calls
    of one table's lookup (the zipf_mix's fused backward: 8.2 ms predicted from warm calls against
    13.2 ms measured in training). FBGEMM's TBE benchmarks flush the GPU's L2 for the same reason
    (``--flush-gpu-cache-size-mb``)."""

    def __init__(self, nbytes: int):
        self.buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)

    def __call__(self) -> None:
        self.buf.add_(1.0)


def _lookup_batch(rows: int, B: int, P: int, gen: torch.Generator, spread: Optional[torch.Tensor] = None):
    """B bags of P ids: uniform over the rows, or (``spread``: a permutation of the rows) skewed,
    P(rank k) ~ 1/k (Zipf 1, drawn log-uniformly), the ranks scattered over the table by ``spread``."""
    from neo.sparse import KeyedJaggedBatch

    if spread is None:
        ids = torch.randint(0, rows, (B * P,), generator=gen)
    else:
        u = torch.rand(B * P, generator=gen, dtype=torch.float64)
        ids = spread[(torch.exp(u * math.log(rows + 1)) - 1).long().clamp_(0, rows - 1)]
    return KeyedJaggedBatch(("f",), ids, torch.full((B,), P, dtype=torch.int64), B)


def _weighted_batch(keys: Tuple[str, ...], rows: int, B: int, P: int, gen: torch.Generator):
    """B bags of P uniform ids for each of ``keys``."""
    from neo.sparse import KeyedJaggedBatch

    F = len(keys)
    return KeyedJaggedBatch(keys, torch.randint(0, rows, (F * B * P,), generator=gen),
                            torch.full((F * B,), P, dtype=torch.int64), B)


def lookup_rows(footprint: int, D: int) -> int:
    """Rows of an fp32 table of ``D`` with as much Adagrad state, ``footprint`` bytes in all."""
    return max(64, footprint // (8 * D))


def largest_footprint(ram_bytes: int, world_size: int) -> int:
    """Bytes of the largest calibration table a rank may allocate: 2 GiB, or less where the ranks of
    the host would take more than a sixth of its memory (0: none beyond the fixed sizes). A rank's
    fused kernels walk all its tables: with gigabytes of them, the rows' page-table entries no
    longer fit the caches (zipf_mix's ten tables, 1.3 GB, trained 20% slower than a 384 MB table
    of the same ids predicted)."""
    big = min(2 << 30, int(ram_bytes) // (6 * max(1, world_size))) if ram_bytes else 0
    return big if big >= 1 << 30 else 0


def lookup_cases(quick: bool = False, largest: int = 0) -> List[Tuple[int, int, int, bool, int]]:
    """``(footprint, D, P, skewed, B)`` of every :func:`lookups` record: tables from cache-sized to
    far larger, bags of ``P`` ids, uniform ids and (on the largest table) skewed ones, whose few
    ids a row tell the cost per id from the cost per row (uniform ids on a large table touch as
    many rows as ids), and ``B`` bags: 2048, and 512 at one dim, for with one batch size the cost
    per bag and the cost per call are one column twice (and a plan whose ranks pool more bags,
    row-wise: every table's bags on every rank, would be charged per call); ``largest``
    (:func:`largest_footprint`) adds a table of that many bytes, the far end of the cold
    bandwidths (not in quick mode)."""
    footprints = (256 << 10, 16 << 20, 384 << 20) + ((int(largest),) if largest and not quick else ())
    dims = (16, 64) if quick else (16, 64, 128)
    pools = (1, 16) if quick else (1, 16, 48)        # multi-hot features reach tens of ids a bag
    out = []
    for foot in footprints:
        for D in dims:
            skews = (False, True) if foot == footprints[-1] else (False,)
            out += [(foot, D, P, sk, 2048) for P in pools for sk in skews]
            if D == dims[1]:
                out += [(foot, D, P, False, 512) for P in pools]
    return out


def lookups(group, quick: bool = False, evict_bytes: int = 0, largest: int = 0) -> List[Dict[str, float]]:
    """Records ``{"phase": "fwd"|"bwd", "bags", "ids", "distinct", "row_bytes", "state_bytes",
    "footprint", "seconds"}`` of one-table lookups (adagrad: state as large as the weights); with
    ``evict_bytes``, the caches are evicted (:class:`CacheEvictor`) before every timed call."""
    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.embedding import TableBatchedEmbedding

    gen = torch.Generator().manual_seed(dist.get_rank(group) if group is not None else 0)
    reps = 5 if quick else 9
    out = []
    warm = True
    evict = CacheEvictor(evict_bytes) if evict_bytes else (lambda: None)
    cases = lookup_cases(quick, largest)
    for foot, D in dict.fromkeys((c[0], c[1]) for c in cases):
        rows = lookup_rows(foot, D)
        emb = TableBatchedEmbedding([TableConfig("t", rows, D, feature_names=("f",),
                                                 optimizer=OptimizerConfig("adagrad", lr=0.01))],
                                    backend="auto", validate=False)
        perm = torch.randperm(rows, generator=gen)     # skewed ids: hot ranks scattered over the table
        for P, spread, B in ((P, perm if skewed else None, B) for f, d, P, skewed, B in cases
                             if (f, d) == (foot, D)):
            # A fresh batch for every call, as in training: the same batch again finds its rows
            # in the caches (the zipf_mix's fused backward: 7.3 ms on repeated batches, 13.7 ms
            # on a new batch each step, the planner's prediction off by as much).
            def fresh():
                return _lookup_batch(rows, B, P, gen, spread)

            def fresh_cold():
                b = fresh()
                evict()
                return b

            def forward_cold():
                pooled = emb(fresh())
                evict()
                return pooled
            distinct = int(torch.unique(fresh().values).numel())
            grad = torch.randn(B, D, generator=gen)
            warmup = 10 if warm else 2                   # the first kernel calls of the process
            warm = False
            with torch.no_grad():
                fwd = timed(lambda b: emb(b), reps, group, warmup, setup=fresh_cold, cpu=True)
            bwd = timed(lambda out: out.backward(grad), reps, group, warmup, setup=forward_cold, cpu=True)
            common = {"bags": B, "ids": B * P, "distinct": distinct, "row_bytes": 4 * D, "state_bytes": 4 * D,
                      "footprint": rows * 8 * D}
            out.append(dict(common, phase="fwd", seconds=fwd))
            out.append(dict(common, phase="bwd", seconds=bwd))
        emb = None                                       # free the table before the next one
    return out


def weighted_lookups(group, quick: bool = False) -> List[Dict[str, float]]:
    """Records ``{"features", "bags", "ids", "dim", "with", "without", "seconds"}``: cache-sized
    tables' lookup, forward + backward, with :class:`neo.embedding.PositionWeights` before it
    (learnable weights: their read and gradient) and without, timed in turn; ``seconds`` is the
    difference, what the cost model's ``weighted_*`` constants charge. Bags of 1 and 16 ids (and
    48), 2048 and 512 bags, one table, and the same ids over 8 one-feature tables, so that the
    cost per bag, per id, per feature and per call are told apart."""
    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.embedding import PositionWeights, TableBatchedEmbedding

    gen = torch.Generator().manual_seed(dist.get_rank(group) if group is not None else 0)
    reps, rounds = (9, 1) if quick else (15, 3)
    out = []
    warm = True
    cases = [(D, 1, P, B) for D in ((16,) if quick else (16, 64))
             for P, B in ((1, 2048), (16, 2048), (1, 512)) + (() if quick else ((48, 512),))]
    cases += [(16, 8, 1, 256)] + ([] if quick else [(16, 8, 16, 64)])         # the ids of (1, 2048), (16, 512)
    for D, F in dict.fromkeys((d, f) for d, f, _, _ in cases):
        rows = lookup_rows(256 << 10, D) // F
        keys = tuple(f"f{k}" for k in range(F))
        emb = TableBatchedEmbedding([TableConfig(f"t{k}", rows, D, feature_names=(f,),
                                                 optimizer=OptimizerConfig("adagrad", lr=0.01))
                                     for k, f in enumerate(keys)], backend="auto", validate=False)
        for P, B in ((p, b) for d, f, p, b in cases if (d, f) == (D, F)):
            pw = PositionWeights({f: P for f in keys})
            grad = torch.randn(B, F * D, generator=gen)

            def fresh():
                return _weighted_batch(keys, rows, B, P, gen)
            times = {"with": [], "without": []}
            warmup = 20 if warm else 3                  # the first calls of the process run slow
            warm = False
            for _ in range(rounds):                     # in turn: a shared machine's load drifts
                times["with"].append(timed(lambda b: emb(pw(b)).backward(grad), reps, group, warmup, setup=fresh,
                                           cpu=True))
                times["without"].append(timed(lambda b: emb(b).backward(grad), reps, group, warmup, setup=fresh,
                                              cpu=True))
            w, wo = statistics.median(times["with"]), statistics.median(times["without"])
            out.append({"features": F, "bags": F * B, "ids": F * B * P, "dim": D, "with": w, "without": wo,
                        "seconds": max(w - wo, 0.0)})
        emb = None
    return out


def collectives(pg, quick: bool = False) -> List[Dict[str, float]]:
    """Records ``{"op": "alltoall"|"allreduce", "bytes" (a rank sends), "seconds"}``; none in one
    process. The AllReduce is the one the trainer's DDP runs on the dense group: through the
    group's shared-memory exchange where its ranks share a host (``neo.distributed.ddp_hook``,
    ``"transport": "shm"``), else the group's own (``"transport": "group"``: gloo or NCCL). (Until
    2026-12-05 it was always the group's: gloo's loopback ring on one host, 1.4-2.5 ms a bucket of
    4-512 KB on the 2-vCPU Zen 5 VM against the hook's 18-48 us, which made the step model charge
    every multi-rank CPU step about 1.2 ms of AllReduce latency that training never paid.)"""
    from neo.distributed.comms import all_reduce, all_to_all
    from neo.distributed.ddp_hook import mean_over_ranks_

    W = pg.world_size
    if W == 1:
        return []
    out = []
    shm = pg.dense_comm.shm                  # the exchange of the trainer's DDP hook (CPU ranks of one host)
    sizes = (4 << 10, 256 << 10, 4 << 20) if quick else (4 << 10, 64 << 10, 512 << 10, 4 << 20, 16 << 20)
    def burst(fn, n=10):                 # back to back, as in training: the collectives pace the ranks
        def run():
            for _ in range(n):
                fn()
        return timed(run, 5, pg.world, warmup=1) / n

    for nbytes in sizes:
        per = max(1, nbytes // 4 // W)
        x = torch.randn(per * W)
        t = burst(lambda: all_to_all(x, [per] * W, [per] * W, pg.world_comm).wait())
        out.append({"op": "alltoall", "bytes": per * 4 * (W - 1), "seconds": t})
        g = torch.randn(max(1, nbytes // 4))
        if shm is not None:
            t = burst(lambda: mean_over_ranks_(shm, g))
        else:
            t = burst(lambda: all_reduce(g, pg.dense).wait())
        out.append({"op": "allreduce", "bytes": g.numel() * 4 * 2 * (W - 1) / W, "seconds": t,
                    "transport": "group" if shm is None else "shm"})
    return out


def dense(group, quick: bool = False) -> List[Dict[str, float]]:
    """Records ``{"kind": "mlp"|"interaction"|"optimizer", ..., "seconds"}`` (forward + backward)."""
    from neo.models.interaction import DotInteraction
    from neo.models.mlp import MLP

    gen = torch.Generator().manual_seed(0)
    B = 2048
    reps = 3 if quick else 5
    out = []
    # sizes of DLRM towers, powers of two and not (an interaction's output width rarely is one),
    # down to the 1-wide logit layer
    shapes = [(13, 64), (64, 16), (512, 256), (256, 64), (64, 512), (1024, 1024), (100, 64), (64, 1)]
    if quick:
        shapes = shapes[:4]
    # each at two batch sizes: a layer's fixed cost (dense_layer_s) apart from its work per
    # activation element (dense_elem_s), which a small layer's time follows
    for b in (B, B // 8):
        for i, o in shapes:
            m = MLP(i, [o])
            x = torch.randn(b, i, generator=gen, requires_grad=True)

            def step():
                m(x).sum().backward()
            out.append({"kind": "mlp", "layers": 1, "flops": 6.0 * b * i * o, "interaction_flops": 0.0,
                        "elems": float(b * (i + o)), "seconds": timed(step, reps, group, cpu=True)})
    for F, D in ((8, 16), (26, 64)) if quick else ((8, 16), (26, 64), (26, 128)):
        inter = DotInteraction(F, D)
        d = torch.randn(B, D, generator=gen, requires_grad=True)
        p = torch.randn(B, F * D, generator=gen, requires_grad=True)

        def step():
            inter(d, p).sum().backward()
        n = F + 1
        out.append({"kind": "interaction", "layers": 0, "flops": 0.0, "elems": 0.0,
                    "interaction_flops": 3.0 * B * n * (n - 1) * D, "seconds": timed(step, reps, group, cpu=True)})
    for n in (1 << 20, 8 << 20):
        params = [torch.nn.Parameter(torch.randn(n // 4)) for _ in range(4)]
        for q in params:
            q.grad = torch.randn_like(q)
        opt = torch.optim.Adagrad(params, lr=0.01, fused=True)
        out.append({"kind": "optimizer", "bytes": n * 4.0 * 4, "seconds": timed(opt.step, reps, group, cpu=True)})
    return out


CACHE_SKEW = 1.05
"""Zipf exponent of :func:`cache`'s ids (that of ``configs/cached_tables.yaml``)."""


def cache_cases(N: int) -> List[Tuple[int, int]]:
    """:func:`cache`'s (cache rows, ids a batch) over N rows: batch and cache sizes each varied
    with the other fixed, every cache at least twice a batch's distinct rows."""
    return [(N // 50, 1024), (N // 50, 4096), (N // 20, 4096), (N // 10, 4096), (N // 20, 16384), (N // 5, 16384)]


def cache(group, quick: bool = False, store_dir: Optional[str] = None) -> List[Dict[str, float]]:
    """Records ``{"batches": 1, "accesses", "misses", "row_bytes", "seconds", "cache_rows",
    "batch"}``: the work of one ``TableCache.prefetch`` (a batch's admission under the default
    ``lookahead`` policy, its victims written back, its misses read), the median over a full
    cache, for each (cache rows, ids a batch) of :func:`cache_cases`, so that a fit can tell the
    cost per batch, per distinct row and per miss apart (:func:`neo.calibrate.cache_constants`).

    One table of 1M rows x 32 fp32 with Adagrad's state per element over a memory-mapped file
    (the CPU's default store, its pages kept mapped as training's ``cache_store_resident_gib``
    does) in ``store_dir`` (the system's temporary directory by default; the file is unlinked at
    once); ids Zipf(:data:`CACHE_SKEW`) over the rows in a random order; the next 32 batches in
    the lookahead window and two batches in flight, as in training; each batch's slots marked
    dirty as training's are (``train=True``), so every victim is written back. Each cache first
    takes batches until its misses exceed its slots by a fifth (a cache still filling has no
    victims to write back: cheaper misses); then the cases take turns batch by batch (one cache
    each, over the same store), so a shared machine's drifting load hits all alike."""
    import numpy as np

    from data_pipeline.locality import zipf_ranks
    from neo.config.embedding import TableConfig
    from neo.embedding.cache import MmapStore
    from neo.embedding.cache.table_cache import TableCache
    from neo.embedding.init import TableRegion

    N, D, lookahead, timed_batches = 1_000_000, 32, 32, (30 if quick else 100)
    rng = np.random.default_rng(11)
    order = rng.permutation(N)

    def batch(B: int) -> torch.Tensor:
        return torch.from_numpy(np.unique(order[zipf_ranks(rng, B, N, CACHE_SKEW)]))

    def step(k: Dict[str, Any]) -> Tuple[float, int, int]:
        """One prefetch of case ``k``: (seconds, distinct rows, misses)."""
        tc, rows = k["cache"], k["window"].pop(0)
        k["window"].append(batch(k["B"]))
        m0, t0 = tc.stats.misses, tc.stats.prefetch_s
        seq, _ = tc.prefetch(rows, k["window"][:lookahead])
        if k["prev"] is not None:
            tc.complete(k["prev"])
        k["prev"] = seq
        return tc.stats.prefetch_s - t0, int(rows.numel()), tc.stats.misses - m0

    with tempfile.TemporaryDirectory(prefix="neo-calibrate-cache-", dir=store_dir) as d:
        store = MmapStore("calibrate", N, D, torch.float32, [False], d, trim_bytes=2 << 30)
        store.initialize(TableRegion.whole("calibrate", N, D), 3, 0.5, [0.25])
        cases = []
        for C, B in cache_cases(N):
            cfg = TableConfig("calibrate", N, D, feature_names=("f",), placement="cached", cache_rows=C)
            k = {"cache": TableCache(cfg, torch.zeros(C, D), [torch.zeros(C, D)], store), "B": B,
                 "window": [batch(B) for _ in range(lookahead + 1)], "prev": None, "recs": []}
            while k["cache"].stats.misses < 1.2 * C:
                step(k)
            cases.append(k)
        if group is not None:
            dist.barrier(group=group)
        for _ in range(timed_batches):
            for k in cases:
                k["recs"].append(step(k))
        out = []
        for k in cases:
            r = np.array(k["recs"], dtype=np.float64)
            out.append({"batches": 1.0, "accesses": float(r[:, 1].mean()), "misses": float(r[:, 2].mean()),
                        "row_bytes": float(store.row_bytes), "seconds": float(np.median(r[:, 0])),
                        "cache_rows": float(k["cache"].capacity), "batch": float(k["B"])})
            k["cache"].complete(k["prev"])
            k["cache"].drop()
    return out
