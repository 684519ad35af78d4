"""The workload and the systems that ``tools/bench_embedding.py`` times on it: the batches, and
one :class:`Runner` per system (Neo's module, FBGEMM's CPU TBE, ``nn.EmbeddingBag`` + Adagrad,
the gather probe at each prefetch setting), all starting from Neo's initial tables. The
benchmark's module doc describes the workload and the systems; this file builds them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_gather_probe import evictor, flush_mib_default, make_table, memory_latency_ns  # noqa: E402

from data_pipeline.locality import coprime_multiplier, zipf_ranks  # noqa: E402

from neo.config.embedding import OptimizerConfig, TableConfig  # noqa: E402
from neo.embedding import TableBatchedEmbedding  # noqa: E402
from neo.sparse import KeyedJaggedBatch  # noqa: E402

LR, EPS = 0.01, 1e-8


def skewed_ids(n: int, rows: int, skew: float, rng: np.random.Generator) -> torch.Tensor:
    """(n,) int64 ids of one table: Zipf(``skew``) ranks (P(rank r) ~ (r + 1) ** -skew, the
    synthetic data's :func:`~data_pipeline.locality.zipf_ranks`) scattered over the rows by a
    fixed bijection (rank * a + c) mod rows, so that the hot rows are not the table's first ones."""
    a = coprime_multiplier(rows, 1_000_003) % rows
    return torch.from_numpy((zipf_ranks(rng, n, rows, skew) * a + rows // 3) % rows)


def make_batches(args, n_batches: int, device: str = "cpu") -> List[KeyedJaggedBatch]:
    """``n_batches`` batches of the workload: bag lengths uniform in 1 .. 2 * pooling_factor - 1,
    ids uniform over each table's rows, or (``args.skew`` > 0) Zipf-skewed (:func:`skewed_ids`)."""
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    keys = tuple(f"f{t}" for t in range(args.tables))
    out = []
    for _ in range(n_batches):
        lengths = torch.randint(1, 2 * args.pooling_factor, (args.tables * args.batch,), generator=gen)
        n = int(lengths.sum())
        if args.skew > 0:
            per_table = lengths.view(args.tables, args.batch).sum(1).tolist()
            ids = torch.cat([skewed_ids(int(k), args.rows, args.skew, rng) for k in per_table])
        else:
            ids = torch.randint(0, args.rows, (n,), generator=gen)
        w = torch.rand(n, generator=gen) + 0.5 if args.weighted else None
        out.append(KeyedJaggedBatch(keys, ids, lengths, args.batch, weights=w).to(device))
    return out


def learnable(b: KeyedJaggedBatch, learn: bool) -> Optional[torch.Tensor]:
    """``learn`` (``--learnable-weights``): give ``b`` a fresh leaf of its weights (the same
    storage) that requires grad, and return it (None: no weights, or weights not learned)."""
    if b.weights is None or not learn:
        return None
    b.weights = b.weights.detach().requires_grad_()
    return b.weights


def upstream_grad(args, device: str = "cpu") -> torch.Tensor:
    """(B, tables * D): the gradient every system's ``fwd_bwd`` back-propagates (the same in all)."""
    return torch.randn(args.batch, args.tables * args.dim, generator=torch.Generator().manual_seed(1)).to(device)


class Runner:
    """One backend: ``fwd(batch)`` and ``fwd_bwd(batch)`` (None: forward only; it returns the
    gradient of the batch's per-id weights, None without them)."""

    def __init__(self, name: str, fwd: Callable, fwd_bwd: Optional[Callable]):
        self.name, self.fwd, self.fwd_bwd = name, fwd, fwd_bwd


BATCHES = 8   # CPU: pre-generated batches, read in turn one per call (bench_embedding.py's module doc)
PROBE_DISTANCES = ((0, 0), (8, 0), (16, 0), (16, 128), (32, 256), (64, 512))


def probe_runners(args, dtype: str, batches) -> Tuple[List[Runner], Optional[float]]:
    """The gather probe on the rows each batch reads, one runner per prefetch setting; and the
    memory latency on the probe's table (bench_gather_probe.memory_latency_ns, after a write pass
    over twice the last-level cache; None without a probe)."""
    from neo import _C
    from neo.cpp import cpu_isa_info

    row_bytes = args.dim * (2 if dtype == "fp16" else 4)
    if row_bytes % 64:
        print(f"note: rows of {row_bytes} bytes are not whole cache lines; no probe")
        return [], None
    table = make_table(args.tables * args.rows * row_bytes / (1 << 30))
    latency_ns = memory_latency_ns(table, evictor(flush_mib_default(cpu_isa_info()["cpu_caches"])))
    B = args.batch
    gids = {}
    for b in batches:   # global row of every id: table t's rows follow table t - 1's
        starts = b.offsets[::B]
        table_of_id = torch.repeat_interleave(torch.arange(args.tables), starts[1:] - starts[:-1])
        gids[id(b)] = (b.values + table_of_id * args.rows).contiguous()

    def make(near: int, far: int) -> Runner:
        return Runner(f"probe@{near},{far}", lambda b: _C.gather_probe(table, row_bytes, gids[id(b)], near, far), None)

    return [make(n, f) for n, f in PROBE_DISTANCES], latency_ns


def neo_runners(args, names=("neo", "neo-noval"), backend: str = "cpu", device: str = "cpu", dtype: str = "fp32",
                tunings: Tuple[Dict[str, int], ...] = ()) -> Tuple[List[Runner], List[torch.Tensor]]:
    """Neo's module timed validate on (``names[0]``) and off (``names[1]``); each of ``tunings``
    (``--neo-tuning``) adds it once more, validate on, under those kernel settings
    (``neo._C._set_tuning``, this CPU's defaults restored after each call): a runner named
    ``neo@`` and the settings. Each runner has a module of its own, all from the same seed, so
    from the same tables (``neo.embedding.init``: seeded per table and block): a runner that shared
    another's tables would find them warm whenever it ran right after it (the benchmark's module
    doc). Also returned: the first module's initial tables (views, in their storage dtype), for
    the peers to start from."""
    tables = [TableConfig(f"t{t}", args.rows, args.dim, feature_names=(f"f{t}",), dtype=dtype,
                          optimizer=OptimizerConfig("rowwise_adagrad", lr=LR, eps=EPS)) for t in range(args.tables)]

    def module() -> TableBatchedEmbedding:
        return TableBatchedEmbedding(tables, backend=backend, device=device)   # seed 0: the same tables

    first = module()
    weights = [first.table_weight(t.name) for t in tables]
    grad = upstream_grad(args, device)

    def make(emb: TableBatchedEmbedding, validate: bool, name: str) -> Runner:
        def fwd(b):
            emb.validate = validate
            with torch.no_grad():
                return emb(b)

        def fwd_bwd(b):
            emb.validate = validate
            w = learnable(b, args.learnable_weights)
            emb(b).backward(grad)
            return None if w is None else w.grad

        return Runner(name, fwd, fwd_bwd)

    def tuned(settings: Dict[str, int]) -> Runner:
        from neo import _C

        base = make(module(), True, names[0])

        def under(fn):
            def run(b):
                _C._set_tuning(**settings)
                try:
                    return fn(b)
                finally:
                    _C._set_tuning()
            return run

        label = ",".join(f"{k}={v}" for k, v in settings.items())
        return Runner(f"{names[0]}@{label}", under(base.fwd), under(base.fwd_bwd))

    runners = [make(first, True, names[0])] + ([make(module(), False, names[1])] if len(names) > 1 else [])
    return runners + [tuned(t) for t in tunings], weights


def fbgemm_runner(args, weights: List[torch.Tensor], notes: Dict[str, str], dtype: str = "fp32") -> Optional[Runner]:
    """FBGEMM's CPU TBE starting from Neo's tables ``weights`` (None, with ``notes["fbgemm"]`` saying
    why, where fbgemm_gpu does not import)."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
    except Exception as e:  # noqa: BLE001 - any import failure means: no fbgemm
        notes["fbgemm"] = f"left out: fbgemm_gpu not importable ({type(e).__name__}: {e})"
        return None
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(args.rows, args.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * args.tables,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=LR, eps=EPS,
        weights_precision=SparseType.FP16 if dtype == "fp16" else SparseType.FP32, pooling_mode=PoolingMode.SUM,
    )
    with torch.no_grad():                 # the same tables as Neo's (same storage dtype): the same work
        for mine, w in zip(tbe.split_embedding_weights(), weights):
            mine.copy_(w)
    grad = upstream_grad(args)

    def fwd(b):
        with torch.no_grad():
            return tbe(b.values, b.offsets, per_sample_weights=b.weights)

    def fwd_bwd(b):
        w = learnable(b, args.learnable_weights)
        tbe(b.values, b.offsets, per_sample_weights=w).backward(grad)
        return None if w is None else w.grad

    return Runner("fbgemm", fwd, fwd_bwd)


def torch_runner(args, weights: List[torch.Tensor], device: str = "cpu") -> Runner:
    """``nn.EmbeddingBag`` a table, starting from Neo's fp32 tables ``weights``."""
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True) for _ in range(args.tables)).to(device)
    with torch.no_grad():
        for bag, w in zip(bags, weights):
            bag.weight.copy_(w)
    opt = torch.optim.Adagrad(bags.parameters(), lr=LR, eps=EPS)
    grad = upstream_grad(args, device)
    B = args.batch

    def split(b):
        # per feature: its ids, the B bag starts relative to the feature's first id, its weights
        starts = b.offsets[::B].tolist()
        return [(b.values[starts[f]:starts[f + 1]], b.offsets[f * B:(f + 1) * B] - starts[f],
                 None if b.weights is None else b.weights[starts[f]:starts[f + 1]]) for f in range(args.tables)]

    def lookup(b):
        return torch.cat([bag(ids, offs, per_sample_weights=w) for bag, (ids, offs, w) in zip(bags, split(b))], dim=1)

    def fwd(b):
        with torch.no_grad():
            return lookup(b)

    def fwd_bwd(b):
        w = learnable(b, args.learnable_weights)
        lookup(b).backward(grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return None if w is None else w.grad

    return Runner("torch", fwd, fwd_bwd)
