"""Output distribution as PooledPieces (read in place by the fused dot interaction) against the
assembled (B, F * D) tensor: the same losses, dense gradients and embedding updates, bit for bit."""

from __future__ import annotations

import datetime

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.models import DotInteraction
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

D, B, F = 16, 7, 5


def _train(rank: int, world_size: int, sharding: str):
    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    tables = [TableConfig(f"t{i}", 30 + i, D, (f"f{i}",), optimizer=OptimizerConfig("adagrad", lr=0.1))
              for i in range(F)]
    plan = even_plan(tables, {t.name: sharding for t in tables}, world_size, world_size)
    gen = torch.Generator().manual_seed(10 + rank)
    batches = []
    for _ in range(3):
        lengths = torch.randint(0, 4, (F * B,), generator=gen)
        ids = torch.cat([torch.randint(0, 30, (int(n),), generator=gen) for n in lengths])
        batches.append((KeyedJaggedBatch(tuple(f"f{i}" for i in range(F)), ids, lengths, B),
                        torch.randn(B, D, generator=gen), torch.randn(B, D + (F + 1) * F // 2, generator=gen)))
    results = {}
    for pieces in (True, False):
        sec = ShardedEmbeddingCollection(tables, plan, pg, seed=5)
        inter = DotInteraction(F, D)
        outs, dense_grads, kinds = [], [], set()
        for kjb, dense, w in batches:
            dense = dense.clone().requires_grad_()
            db = sec.input_dist(kjb).wait()
            pooled = sec.output_dist(sec.compute(db), db, pieces=pieces).wait()
            kinds.add(type(pooled).__name__)
            out = inter(dense, pooled)
            (out * w).sum().backward()
            outs.append(out.detach())
            dense_grads.append(dense.grad)
        weights = [p.detach().clone() for p in sec.lookup.parameters()] + \
                  [b.detach().clone() for b in sec.lookup.buffers()]
        results[pieces] = (outs, dense_grads, weights, kinds)
    return results


@pytest.mark.parametrize("sharding,pieces_used", [("table_wise", True), ("column_wise", False)])
def test_pooled_pieces_equal_the_assembled_tensor(sharding, pieces_used):
    for res in run_multiprocess(_train, 2, sharding):
        (o1, g1, w1, k1), (o2, g2, w2, k2) = res[True], res[False]
        assert k1 == ({"PooledPieces"} if pieces_used else {"Tensor"}) and k2 == {"Tensor"}
        assert len(w1) == len(w2) > 0
        for a, b in zip(o1 + g1 + w1, o2 + g2 + w2):
            assert torch.equal(a, b)
