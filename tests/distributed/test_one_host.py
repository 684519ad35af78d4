"""Every sharding type in one AlltoAll per direction (OneHostOutputDist) against one output
distribution per type: the same pooled outputs, gradients and updated shards, bit for bit.

Unsharded training is the oracle of the fused path too: test_distributed_equivalence's cases
with every rank on one host run it (ShardedEmbeddingCollection fuses by default there)."""

from __future__ import annotations

import datetime
from typing import Dict, List

import pytest
import torch

from neo.config.embedding import OptimizerConfig, PoolingMode, TableConfig
from neo.distributed import CommConfig, ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.models import DotInteraction, PooledPieces
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

B, D = 5, 16
TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise")
QUANTIZED_TYPES = ("row_wise", "table_column_wise", "data_parallel", "column_wise", "table_wise")


def _tables(n: int, mean=()) -> List[TableConfig]:
    dims = [8, 16, 4, 12]
    return [TableConfig(f"t{i}", 20 + 3 * i, dims[i % len(dims)], (f"f{i}",) if i % 3 else (f"f{i}", f"g{i}"),
                        pooling=PoolingMode.MEAN if i in mean else PoolingMode.SUM,
                        optimizer=OptimizerConfig("adagrad", lr=0.2, initial_accumulator_value=0.1))
            for i in range(n)]


def _plans(W: int) -> Dict[str, tuple]:
    """name -> (tables, plan, comm); names starting "read in place": the output as PooledPieces."""
    mixed = _tables(8, mean=(2, 4))
    plans = {
        "mixed": (mixed, even_plan(mixed, {t.name: TYPES[i % 6] for i, t in enumerate(mixed)}, W, W), CommConfig()),
        # 16-bit wire, without table_row_wise: one type at a time, its sum goes over the wire twice (the
        # ReduceScatter's partial sums, then the cross-host AlltoAll of one rank re-rounds it); in the
        # fused AlltoAll, once
        "mixed fp16 / bf16": (mixed, even_plan(mixed, {t.name: QUANTIZED_TYPES[i % 5] for i, t in enumerate(mixed)},
                                               W, W), CommConfig(forward="fp16", backward="bf16")),
    }
    # row-wise and table-row-wise tables split over ranks 0 and 1 only, a table-wise one on rank 0:
    # at W 3, rank 2 holds no row-wise shard (its summed block goes out as zeros) and only
    # data-parallel columns
    few = _tables(4, mean=(1,))
    plan = even_plan(few, {"t0": "table_wise", "t1": "row_wise", "t2": "table_row_wise", "t3": "data_parallel"}, W, W)
    for name in ("t1", "t2"):
        t = next(x for x in few if x.name == name)
        half = t.num_rows // 2
        plan["tables"][name]["shards"] = [dict(rank=0, row_offset=0, rows=half, col_offset=0, cols=t.dim),
                                          dict(rank=1, row_offset=half, rows=t.num_rows - half, col_offset=0,
                                               cols=t.dim)]
    plan["tables"]["t0"]["shards"][0]["rank"] = 0
    plans["row-wise on two ranks"] = (few, plan, CommConfig())
    # at W 3, rank 2 holds no shard at all (no lookup): it still joins both AlltoAlls
    empty = {**plan, "tables": {k: v for k, v in plan["tables"].items() if k != "t3"}}
    plans["a rank without shards"] = (few[:3], empty, CommConfig())
    # one dimension: the fused AlltoAll's output read in place by the dot interaction
    same = [TableConfig(f"t{i}", 25 + i, D, (f"f{i}",), optimizer=OptimizerConfig("adagrad", lr=0.2))
            for i in range(6)]
    plans["read in place, every type"] = (same, even_plan(same, {t.name: st for t, st in zip(same, TYPES)}, W, W),
                                          CommConfig())
    return plans


def _batches(tables: List[TableConfig], rank: int):
    feats = tuple(f for t in tables for f in t.feature_names)
    rows = {f: t.num_rows for t in tables for f in t.feature_names}
    gen = torch.Generator().manual_seed(7 + rank)
    out = []
    for _ in range(3):
        lengths = torch.randint(0, 4, (len(feats) * B,), generator=gen)
        ids = torch.cat([torch.randint(0, rows[f], (int(n),), generator=gen)
                         for f, n in zip([f for f in feats for _ in range(B)], lengths.tolist())])
        out.append(KeyedJaggedBatch(feats, ids, lengths, B))
    return out


def _train(rank: int, world_size: int):
    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    results = {}
    for name, (tables, plan, comm) in _plans(world_size).items():
        for fuse in (True, False):
            sec = ShardedEmbeddingCollection(tables, plan, pg, seed=3, comm=comm, fuse_output_dists=fuse)
            kinds = {type(od).__name__ for od in sec.output_dists}
            assert (kinds == {"OneHostOutputDist"}) == fuse, (name, kinds)
            in_place = name.startswith("read in place")
            inter = DotInteraction(len(tables), D)
            outs, grads = [], []
            for step, kjb in enumerate(_batches(tables, rank)):
                gen = torch.Generator().manual_seed(100 * rank + step)
                db = sec.input_dist(kjb).wait()
                pooled = sec.compute(db)
                if pooled.requires_grad:                # not on a rank without shards
                    pooled.retain_grad()
                out = sec.output_dist(pooled, db, pieces=in_place).wait()
                dense = torch.randn(B, D, generator=gen).requires_grad_()
                if in_place:                  # PooledPieces (fused) or the assembled tensor (one AlltoAll per type)
                    assert isinstance(out, PooledPieces) == fuse, (name, type(out))
                    out = inter(dense, out)
                w = torch.randn(out.shape, generator=gen)
                (out * w).sum().backward()
                outs.append(out.detach().clone())
                grads.append(pooled.grad.clone() if pooled.grad is not None else None)
                if in_place:
                    grads.append(dense.grad.clone())
            state = [] if sec.lookup is None else [p.detach().clone() for p in sec.lookup.parameters()] + \
                [b.detach().clone() for b in sec.lookup.buffers()]
            results[(name, fuse)] = (outs, grads, state)
    return results


@pytest.mark.parametrize("W", [2, 3])
def test_one_alltoall_equals_one_per_type(W):
    for rank, res in enumerate(run_multiprocess(_train, W)):
        for name in _plans(W):
            fused, general = res[(name, True)], res[(name, False)]
            for what, a_list, b_list in zip(("output", "pooled gradient", "shard state"), fused, general):
                assert len(a_list) == len(b_list) and (a_list or what == "shard state"), (name, what)
                for a, b in zip(a_list, b_list):
                    assert (a is None) == (b is None), (rank, name, what)
                    assert a is None or torch.equal(a, b), f"rank {rank}, {name}: {what} differs"


def _kinds(rank: int, world_size: int, L: int):
    pg = ProcessGroups.build(L, timeout=datetime.timedelta(seconds=60))
    out = []
    for types in (TYPES, ("row_wise",) * 3):
        ts = _tables(len(types))
        plan = even_plan(ts, {t.name: st for t, st in zip(ts, types)}, world_size, L)
        sec = ShardedEmbeddingCollection(ts, plan, pg)
        out.append(sorted({type(od).__name__ for od in sec.output_dists}))
    return out


@pytest.mark.parametrize("W,L", [(2, 2), (4, 2)])
def test_fused_on_one_host_for_several_types(W, L):
    """One AlltoAll where every rank is on one host and several output distributions would run;
    one distribution per type across hosts; a single type keeps its own."""
    mixed = ["OneHostOutputDist"] if L == W else \
        sorted({"AllToAllOutputDist", "RowWiseOutputDist", "TableRowWiseOutputDist", "TableColumnWiseOutputDist",
                "DataParallelOutputDist"})
    assert run_multiprocess(_kinds, W, L, local_world_size=L) == [[mixed, ["RowWiseOutputDist"]]] * W
