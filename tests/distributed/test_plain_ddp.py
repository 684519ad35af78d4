"""A model with Neo's tables wrapped in plain ``DistributedDataParallel``.

DDP broadcasts rank 0's buffers before every forward (``broadcast_buffers=True``), the tables among
them: before, rank 1's fused updates were silently replaced by rank 0's tables at the next step
(and a collection's column shards by rank 0's columns). Now the lookup refuses to train
there (neo/embedding/ddp_guard.py), naming the tables; a DDP told to leave the tables alone
(``broadcast_buffers=False``, or the embedding's buffers ignored), evaluation, one rank, and
``neo.distributed.parallelize`` train as before. The oracle for the allowed cases: the same model
unwrapped, trained on the rank's own batch.
"""

from __future__ import annotations

import datetime
import warnings

import torch
from torch.nn.parallel import DistributedDataParallel

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.embedding import ReplicatedTablesError, TableBatchedEmbedding
from neo.models import DLRM
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

F, D, B = 2, 8, 4
TABLES = [TableConfig(f"t{i}", 20, D, optimizer=OptimizerConfig("sgd", lr=0.5)) for i in range(F)]


def _model(embedding=None) -> DLRM:
    torch.manual_seed(0)
    return DLRM(embedding or TableBatchedEmbedding(TABLES, backend="cpu"), F, D, 13, [16, D], [16, 1])


def _batch(rank: int):
    ids = torch.full((F * B,), rank + 1)         # rank r reads row r + 1 of every table
    return torch.randn(B, 13, generator=torch.Generator().manual_seed(rank)), \
        KeyedJaggedBatch(("t0", "t1"), ids, torch.ones(F * B, dtype=torch.int64), B)


def _wrap(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)      # broadcast_buffers is deprecated in name only
        return DistributedDataParallel(model, **kwargs)


class _SequenceSum(torch.nn.Module):
    """A model over unpooled lookups (``emb.sequence``), with one dense parameter for DDP."""

    def __init__(self):
        super().__init__()
        self.emb = TableBatchedEmbedding(TABLES, backend="cpu")
        self.scale = torch.nn.Parameter(torch.ones(D))

    def forward(self, dense, batch):
        return sum((s.values * self.scale).sum() for s in self.emb.sequence(batch).values())


def _train_step(module, dense, batch, steps: int = 1) -> None:
    for _ in range(steps):     # DDP checks at each forward that every used parameter got its gradient
        module(dense, batch).sum().backward()


def _run(rank: int, world_size: int):
    ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    dense, batch = _batch(rank)
    out = {}
    try:                                            # plain DDP: refused, nothing updated
        model = _model()
        before = model.embedding.table_weight("t0").clone()
        _train_step(_wrap(model), dense, batch)
    except ReplicatedTablesError as e:
        out["refused"] = str(e)
        out["unchanged"] = torch.equal(model.embedding.table_weight("t0"), before)
    try:                                            # the unpooled lookup: refused as well
        _wrap(_SequenceSum())(dense, batch).backward()
    except ReplicatedTablesError as e:
        out["sequence_refused"] = str(e)
    with torch.no_grad():                           # evaluation inside the same DDP: allowed
        ddp = _wrap(_model())
        ddp.eval()
        out["eval"] = ddp(dense, batch)
    reference = _model()                            # the oracle: unwrapped, the rank's own batch
    _train_step(reference, dense, batch, steps=3)
    quiet, ignoring = _model(), _model()
    _train_step(_wrap(quiet, broadcast_buffers=False), dense, batch, steps=3)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        ignoring, [f"embedding.{n}" for n, _ in ignoring.embedding.named_buffers()])
    _train_step(_wrap(ignoring), dense, batch, steps=3)   # the module's autograd_anchor left to DDP
    out["allowed"] = [torch.equal(m.embedding.table_weight(t), reference.embedding.table_weight(t))
                      for m in (quiet, ignoring) for t in ("t0", "t1")]
    # a collection under plain DDP: refused too. Column shards have the same shape on every rank,
    # so DDP would have copied rank 0's columns over rank 1's (shards of unequal shapes make gloo's
    # broadcast abort instead)
    plan = even_plan(TABLES, {"t0": "column_wise", "t1": "column_wise"}, world_size, world_size)
    sharded = _model(ShardedEmbeddingCollection(TABLES, plan, ProcessGroups.build(), seed=1))
    try:
        _train_step(_wrap(sharded), dense, batch)
    except ReplicatedTablesError as e:
        out["collection_refused"] = str(e)
    return out


def test_plain_ddp_over_neo_tables_is_refused_and_the_ways_out_train():
    for r in run_multiprocess(_run, 2):
        assert "'t0', 't1' are trained inside torch.nn.parallel.DistributedDataParallel" in r["refused"]
        assert "neo.distributed.parallelize" in r["refused"] and r["unchanged"]
        assert "'t0', 't1' are trained inside" in r["sequence_refused"]
        assert r["eval"].shape == (B,)
        assert r["allowed"] == [True] * 4
        assert "DistributedDataParallel's forward" in r["collection_refused"]


def _one_rank(rank: int, world_size: int):
    ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    dense, batch = _batch(rank)
    model, reference = _model(), _model()
    _train_step(_wrap(model), dense, batch)          # one rank: nothing to overwrite, allowed
    _train_step(reference, dense, batch)
    return torch.equal(model.embedding.table_weight("t0"), reference.embedding.table_weight("t0"))


def test_ddp_of_one_rank_trains():
    assert run_multiprocess(_one_rank, 1) == [True]
