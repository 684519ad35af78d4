"""The fused updates under ``torch.amp.GradScaler`` (``emb.grad_scaler = scaler``).

Before, ``scaler.scale(loss).backward()`` updated the tables with gradients S times too large
(1024x at S = 1024) and an overflowed step wrote inf into the rows, while the scaler unscaled and
skipped the dense step. The oracle: the same training without a scaler. GradScaler's scales are
powers of two, so dividing by them is exact and the tables must match to the bit; an overflowed
step must leave tables and step counts as they were, as the scaler leaves the dense parameters.
"""

from __future__ import annotations

import datetime

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.models import DLRM
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

F, D, B, ROWS = 3, 8, 6, 30
KEYS = tuple(f"t{i}" for i in range(F))


def tables(optimizer: str):
    return [TableConfig(f"t{i}", ROWS, D, optimizer=OptimizerConfig(optimizer, lr=0.05)) for i in range(F)]


def batch(step: int):
    gen = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (F * B,), generator=gen)
    ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
    return torch.randn(B, 13, generator=gen), KeyedJaggedBatch(KEYS, ids, lengths, B)


def model(optimizer: str) -> DLRM:
    torch.manual_seed(0)
    return DLRM(TableBatchedEmbedding(tables(optimizer), backend="cpu"), F, D, 13, [16, D], [16, 1])


def train(m: DLRM, scaler, steps, loss_factor: float = 1.0, sequence: bool = False) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    m.embedding.grad_scaler = scaler
    for step in steps:
        dense, kjt = batch(step)
        loss = m(dense, kjt).sigmoid().sum()
        if sequence:                                   # and an unpooled lookup's update
            loss = loss + sum((s.values.tanh() ** 2).sum() for s in m.embedding.sequence(kjt).values())
        loss = loss * loss_factor
        opt.zero_grad()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def assert_same_tables(a: DLRM, b: DLRM) -> None:
    for t in KEYS:
        assert torch.equal(a.embedding.table_weight(t), b.embedding.table_weight(t)), t
        for name, state in a.embedding.table_optimizer_state(t).items():
            assert torch.equal(state, b.embedding.table_optimizer_state(t)[name]), (t, name)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("sequence", [False, True])
def test_scaled_training_equals_unscaled_to_the_bit(optimizer, sequence):
    scaled, plain = model(optimizer), model(optimizer)
    train(scaled, torch.amp.GradScaler("cpu", init_scale=2.0 ** 12), range(3), sequence=sequence)
    train(plain, None, range(3), sequence=sequence)
    assert_same_tables(scaled, plain)
    for p, q in zip(scaled.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert scaled.embedding.skipped_updates == 0


@pytest.mark.parametrize("sequence", [False, True])
def test_an_overflowed_step_is_skipped_like_the_dense_step(sequence):
    m, reference = model("adam"), model("adam")
    train(m, None, range(2), sequence=sequence)
    train(reference, None, range(2), sequence=sequence)
    before = [p.clone() for p in m.parameters()]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 100)
    train(m, scaler, [2], loss_factor=1e12, sequence=sequence)   # 1e12 x 2^100: past fp32's range
    assert m.embedding.skipped_updates == (2 if sequence else 1)   # the pooled and the unpooled lookup
    assert_same_tables(m, reference)                                # rows, Adam's moments, step counts
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before))   # the scaler skipped too
    assert scaler.get_scale() < 2.0 ** 100
    train(m, scaler, [3])                                           # then trains again
    assert not torch.equal(m.embedding.table_weight("t0"), reference.embedding.table_weight("t0"))


def _sharded(rank: int, world_size: int):
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan

    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    cfgs = tables("rowwise_adagrad")
    plan = even_plan(cfgs, dict(zip(KEYS, ["table_wise", "column_wise", "row_wise"])), world_size, world_size)
    out = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=2.0 ** 10), None):
        sec = ShardedEmbeddingCollection(cfgs, plan, pg, seed=1)
        sec.grad_scaler = scaler
        for step in range(3):
            _, kjt = batch(10 * step + rank)
            loss = sec(kjt).sigmoid().sum()
            (loss if scaler is None else scaler.scale(loss)).backward()
        with torch.no_grad():
            out.append(sec(batch(99)[1]))
    return out


def test_sharded_collection_passes_the_scaler_to_its_shards():
    for scaled, plain in run_multiprocess(_sharded, 2):
        assert torch.equal(scaled, plain)
