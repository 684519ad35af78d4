"""The sharded collection under torch.func's transforms: its lookup is a constant of the
function, as the unsharded module's (tests/embedding/test_torch_func.py): the same rows as
outside, no update, the collectives as ever. Before, the transform reached the input
distribution's and the lookup's autograd Functions and raised. The module's first lookup is
made under the transform (nothing it caches may hold functorch's wrappers), then it trains."""

from __future__ import annotations

import datetime

import pytest
import torch
from torch.func import grad

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.embedding import EmbeddingInputError
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

B = 4
OPT = OptimizerConfig("adagrad", lr=0.5)
TABLES = [TableConfig("a", 10, 8, ("fa",), optimizer=OPT), TableConfig("b", 12, 8, ("fb",), optimizer=OPT),
          TableConfig("c", 9, 8, ("fc",), optimizer=OPT), TableConfig("d", 7, 8, ("fd",), optimizer=OPT)]
TYPES = {"a": "table_wise", "b": "column_wise", "c": "row_wise", "d": "data_parallel"}


def _batch(rank: int) -> KeyedJaggedBatch:
    gen = torch.Generator().manual_seed(10 + rank)
    lengths = torch.randint(1, 4, (4 * B,), generator=gen)
    ids = torch.randint(0, 7, (int(lengths.sum()),), generator=gen)
    return KeyedJaggedBatch(("fa", "fb", "fc", "fd"), ids, lengths, B)


def _run(rank: int, world_size: int):
    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    sec = ShardedEmbeddingCollection(TABLES, even_plan(TABLES, TYPES, world_size, world_size), pg, seed=1)
    batch = _batch(rank)
    x = torch.randn(B, 32, generator=torch.Generator().manual_seed(rank))

    def f(x):
        return (sec(batch).sigmoid() * x).sum()

    got = grad(f)(x)                                    # the first lookup: under the transform
    seq_got = grad(lambda y: sum((s.values * y).sum() for s in sec.sequence(batch).values()))(x[0, :8])
    with torch.no_grad():
        pooled = sec(batch)
        seq = sec.sequence(batch)
    refused = None
    weighted = KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, B, weights=torch.rand(batch.values.shape))
    try:
        grad(lambda w: sec(KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, B, weights=w)).sum())(
            weighted.weights)
    except EmbeddingInputError as e:
        refused = str(e)
    sec(batch).sum().backward()                         # trains as before: the rows change
    with torch.no_grad():
        after = sec(batch)
    return dict(got=got, want=pooled.sigmoid(), seq_got=seq_got,
                seq_want=sum(s.values.sum(0) for s in seq.values()), refused=refused,
                changed=not torch.equal(after, pooled))


def test_sharded_lookup_is_a_constant_under_torch_func():
    for r in run_multiprocess(_run, 2):
        torch.testing.assert_close(r["got"], r["want"], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(r["seq_got"], r["seq_want"], rtol=1e-5, atol=1e-6)
        assert r["refused"] and "per-id weights of the lookup into a, b, c, d are differentiated" in r["refused"]
        assert r["changed"]
