"""A DLRM over the sharded collection under ``torch.compile``: the collection's lookup (input
distribution, kernels, output distribution, and in the backward the fused optimizer) runs eagerly
between the compiled dense parts (``torch._disable_dynamo``, neo/embedding/transforms.py), and
training matches an eager twin built from the same plan and seed, table-, column-, row-wise and
data-parallel tables, with no recompilation across batches of different id counts. Before,
Dynamo traced into the collection's Python (its awaitables, splits and autograd Functions)."""

from __future__ import annotations

import datetime

import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.models import DLRM
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

B, D = 4, 8
OPT = OptimizerConfig("adagrad", lr=0.5)
TABLES = [TableConfig("a", 10, D, ("fa",), optimizer=OPT), TableConfig("b", 12, D, ("fb",), optimizer=OPT),
          TableConfig("c", 9, D, ("fc",), optimizer=OPT), TableConfig("d", 7, D, ("fd",), optimizer=OPT)]
TYPES = {"a": "table_wise", "b": "column_wise", "c": "row_wise", "d": "data_parallel"}


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(100 * step + rank)
    lengths = torch.randint(0, 4, (4 * B,), generator=gen)
    ids = torch.randint(0, 7, (int(lengths.sum()),), generator=gen)
    batch = KeyedJaggedBatch(("fa", "fb", "fc", "fd"), ids, lengths, B)
    return batch, torch.randn(B, 13, generator=gen), torch.rand(B, generator=gen).round()


def _model(pg: ProcessGroups, world_size: int) -> DLRM:
    torch.manual_seed(7)
    sec = ShardedEmbeddingCollection(TABLES, even_plan(TABLES, TYPES, world_size, world_size), pg, seed=1)
    return DLRM(sec, 4, D, 13, [16, D], [16, 1])


def _run(rank: int, world_size: int):
    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    eager, twin = _model(pg, world_size), _model(pg, world_size)
    compiled = torch.compile(twin, backend="aot_eager")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            batch, dense, labels = _batch(rank, step)
            for model, opt in zip((eager, compiled), optimizers):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, batch), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
    batch, dense, _ = _batch(rank, 9)
    with torch.no_grad():
        first = _model(pg, world_size)
        return dict(eager=eager.embedding(batch), twin=twin.embedding(batch), initial=first.embedding(batch),
                    dense=[(a - b).abs().max().item() for a, b in zip(eager.parameters(), twin.parameters())
                           if a.numel()])


def test_compiled_dlrm_over_the_sharded_collection_trains_as_eager():
    for r in run_multiprocess(_run, 2):
        torch.testing.assert_close(r["twin"], r["eager"], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(r["eager"], r["initial"])            # the tables were trained
        assert max(r["dense"]) < 1e-5
