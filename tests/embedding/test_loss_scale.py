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


def _table_only_overflow(neo: bool, sequence: bool = False, steps: int = 6):
    """Steps of one table (SGD) and a dense weight under GradScaler at 2**24, the loss scaling the
    table's pooled output by 1e32: its gradient overflows at scales 2**22 and up, the dense
    weight's never. Neo's fused update, or (the oracle) the same table as a dense parameter through
    ``F.embedding_bag`` with its own ``torch.optim.SGD``, which GradScaler handles itself. With
    ``sequence`` Neo's unpooled lookup instead (one id a bag: the same rows)."""
    torch.manual_seed(0)
    emb = TableBatchedEmbedding([TableConfig("t0", ROWS, D, optimizer=OptimizerConfig("sgd", lr=0.05))],
                                backend="cpu")
    w = torch.nn.Parameter(torch.ones(4))
    opts = [torch.optim.SGD([w], lr=0.05)]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
    if neo:
        emb.grad_scaler = scaler
    else:
        table = torch.nn.Parameter(emb.table_weight("t0").clone())
        opts.append(torch.optim.SGD([table], lr=0.05))
    scales, skipped = [], []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        ids, lengths = torch.randperm(ROWS, generator=gen)[:B], torch.ones(B, dtype=torch.long)
        if neo:
            kjt = KeyedJaggedBatch(("t0",), ids, lengths, B)
            pooled = next(iter(emb.sequence(kjt).values())).values if sequence else emb(kjt)   # (B, D)
        else:
            pooled = torch.nn.functional.embedding_bag(ids, table, torch.arange(B), mode="sum")
        loss = (pooled * 1e32).sum() + (w * 3.0).sum()
        for o in opts:
            o.zero_grad()
        scaler.scale(loss).backward()
        for o in opts:
            scaler.step(o)
        scaler.update()
        scales.append(scaler.get_scale())
        skipped.append(emb.skipped_updates)
    return scales, skipped, emb.table_weight("t0") if neo else table.detach(), w.detach()


@pytest.mark.parametrize("sequence", [False, True])
def test_an_overflow_only_the_tables_see_backs_the_scale_off_as_for_a_dense_parameter(sequence):
    """Before, the scale stayed at 2**24 and every step skipped the table (skipped 1, 2, ... 6)."""
    scales, skipped, table, w = _table_only_overflow(neo=True, sequence=sequence)
    ref_scales, _, ref_table, ref_w = _table_only_overflow(neo=False)
    assert scales == ref_scales                       # 2**23, 2**22, 2**21, then unchanged
    assert scales[-1] < 2.0 ** 22
    assert skipped == [1, 2, 3, 3, 3, 3]              # skipped until the scale fits, then trained
    assert torch.equal(table, ref_table) and torch.equal(w, ref_w)


def _sharded_one_rank_overflows(rank: int, world_size: int):
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan

    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    cfgs = [TableConfig(f"t{i}", ROWS, D, optimizer=OptimizerConfig("sgd", lr=0.05)) for i in range(2)]
    plan = even_plan(cfgs, {"t0": "table_wise", "t1": "table_wise"}, world_size, world_size, ranks={"t0": 0, "t1": 1})
    sec = ShardedEmbeddingCollection(cfgs, plan, pg, seed=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
    sec.grad_scaler = scaler
    gen = torch.Generator().manual_seed(rank)
    kjt = KeyedJaggedBatch(("t0", "t1"), torch.randint(0, ROWS, (2 * B,), generator=gen),
                           torch.ones(2 * B, dtype=torch.long), B)
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.05)
    out = sec(kjt)                                                                   # (B, 2 D)
    loss = (out[:, :D] * 1e32).sum() + out[:, D:].sum() + (w * 3.0).sum()            # t0's gradients overflow
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale(), sec.skipped_updates


def test_on_a_sharded_collection_a_ranks_overflow_lowers_the_scale_alike_on_every_rank():
    """Only t0's owner (rank 0) sees the overflow and skips; reported there alone, its scale would
    fall and the ranks' scales part (DDP then averages gradients scaled differently). Before the
    ranks agreed (neo/distributed/overflow.py), neither rank lowered it."""
    (scale0, skipped0), (scale1, skipped1) = run_multiprocess(_sharded_one_rank_overflows, 2)
    assert (skipped0, skipped1) == (1, 0)
    assert scale0 == scale1 == 2.0 ** 23


STEPS, W = 6, 2
MIXED = [TableConfig("t0", ROWS, D, optimizer=OptimizerConfig("sgd", lr=0.05)),        # overflows
         TableConfig("t1", ROWS, D, optimizer=OptimizerConfig("adagrad", lr=0.05))]    # another fused update


def _overflow_batch(step: int, rank: int):
    """Rank ``rank``'s ids of both tables at ``step``: one id a bag, B bags a table."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randint(0, ROWS, (B,), generator=gen) for _ in MIXED]


def _overflow_loss(out0: torch.Tensor, out1: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """t0's gradients 1e32 a bag: past fp32 at loss scales of 2**22 and up (with GradScaler's 2**24 start)."""
    return (out0 * 1e32).sum() + out1.sum() + (w * 3.0).sum()


def _train_under_overflow(emb, rank: int, ranks: int, sequence: bool):
    """STEPS steps of ``emb`` (sharded: this rank's samples; unsharded: the ``ranks`` ranks'
    samples in rank order, one batch) and a dense weight under GradScaler; the scales, the
    skip counts after each step, and the tables' weights and t1's Adagrad state."""
    from neo.distributed import ShardedEmbeddingCollection

    sharded = isinstance(emb, ShardedEmbeddingCollection)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
    emb.grad_scaler = scaler
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.05)
    scales, skipped = [], []
    for step in range(STEPS):
        per_rank = [_overflow_batch(step, r) for r in ([rank] if sharded else range(ranks))]
        ids = torch.cat([torch.cat([b[t] for b in per_rank]) for t in range(len(MIXED))])   # feature-major
        n = B * len(per_rank)
        kjt = KeyedJaggedBatch(("t0", "t1"), ids, torch.ones(len(MIXED) * n, dtype=torch.long), n)
        if sequence:
            rows = emb.sequence(kjt)
            out0, out1 = rows["t0"].values, rows["t1"].values                    # (n, D) each
        else:
            out = emb(kjt)                                                         # (n, 2 D)
            out0, out1 = out[:, :D], out[:, D:]
        opt.zero_grad()
        scaler.scale(_overflow_loss(out0, out1, w)).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        skipped.append(emb.skipped_updates)
    if sharded:
        weights, state = emb.full_weights(), emb.full_optimizer_state(["t1"])["t1"]
    else:
        weights, state = {t: emb.table_weight(t) for t in ("t0", "t1")}, emb.table_optimizer_state("t1")
    return scales, skipped, weights, state, w.detach()


def _sharded_overflows(rank: int, world_size: int, owners: dict, sequence: bool):
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan

    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    plan = even_plan(MIXED, {"t0": "table_wise", "t1": "table_wise"}, world_size, world_size, ranks=owners)
    sec = ShardedEmbeddingCollection(MIXED, plan, pg, seed=1, average_gradients=False)
    return _train_under_overflow(sec, rank, world_size, sequence) + (sec.overflow_consensus.agreed,)


@pytest.mark.parametrize("owners,sequence", [
    ({"t0": 0, "t1": 1}, False),      # t0's owner alone sees the overflow
    ({"t0": 0, "t1": 0}, False),      # and rank 1 holds no shard at all
    ({"t0": 0, "t1": 0}, True),       # the same, unpooled: rank 1's anchor in the graph all the same
], ids=["owner_and_other", "owner_and_shardless", "sequence_shardless"])
def test_a_sharded_collection_under_overflow_trains_as_the_unsharded_module(owners, sequence):
    """The oracle: the unsharded module (single-device GradScaler behaviour, itself checked against
    a dense table above) on both ranks' samples in one batch, the loss their sum
    (``average_gradients=False``), so that every bag's gradient, and where it overflows, is the
    same. Before the ranks agreed the scale stayed at 2**24 on both ranks and t0 skipped all six
    steps; now both ranks lower it as the oracle does, t0 trains once it fits, to the bit."""
    emb = TableBatchedEmbedding(MIXED, backend="cpu", seed=1)
    ref_scales, ref_skipped, ref_weights, ref_state, ref_w = _train_under_overflow(emb, 0, W, sequence)
    assert ref_scales[-1] < 2.0 ** 22 and 0 < ref_skipped[-1] < STEPS      # the case: skips, then trains
    results = run_multiprocess(_sharded_overflows, W, owners, sequence)
    for rank, (scales, skipped, weights, state, w, agreed) in enumerate(results):
        assert scales == ref_scales, rank                       # alike on every rank, and as the oracle's
        assert agreed == ref_skipped[-1], rank                  # every skip agreed on, on every rank
        assert skipped == (ref_skipped if rank == 0 else [0] * STEPS), rank
        for t in ("t0", "t1"):
            assert torch.equal(weights[t], ref_weights[t]), (rank, t)
        for name, value in ref_state.items():
            assert torch.equal(state[name], value), (rank, name)
        assert torch.equal(w, ref_w), rank


def _parallelized_under_overflow(rank: int, world_size: int):
    """A user model (tables, a linear layer on top) through ``parallelize``: DDP on the dense part
    (its AllReduce in the backward, on its own group) beside the collection's agreement on
    overflows (on the world group), with rank 1 holding no shard. Six steps at a scale that
    starts too high for t0's gradients."""
    from neo.distributed import ProcessGroups, even_plan, parallelize

    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = TableBatchedEmbedding(MIXED, backend="cpu", seed=1)
            self.top = torch.nn.Linear(2 * D, 1)

        def forward(self, kjt):
            out = self.ebc(kjt)                                                    # (B, 2 D)
            return self.top(out).sum() + (out[:, :D] * 1e32).sum()

    torch.manual_seed(0)
    model = Model()
    plan = even_plan(MIXED, {"t0": "table_wise", "t1": "table_wise"}, world_size, world_size, ranks={"t0": 0, "t1": 0})
    ddp = parallelize(model, "ebc", plan, pg)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
    model.ebc.grad_scaler = scaler
    opt = torch.optim.SGD(model.top.parameters(), lr=0.05)
    before = model.ebc.full_weights()["t0"]
    scales = []
    for step in range(STEPS):
        ids = torch.cat(_overflow_batch(step, rank))
        kjt = KeyedJaggedBatch(("t0", "t1"), ids, torch.ones(len(MIXED) * B, dtype=torch.long), B)
        opt.zero_grad()
        scaler.scale(ddp(kjt)).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    trained = not torch.equal(model.ebc.full_weights()["t0"], before)
    return scales, model.ebc.skipped_updates, trained, [p.detach().clone() for p in model.top.parameters()]


def test_a_parallelized_model_under_overflow_keeps_its_ranks_alike():
    """The ranks' scales fall together, step by step, so DDP's averaged dense weights stay the same
    on both ranks; t0 trains once its gradients fit; nothing waits on a collective the other
    rank never starts (the agreement's AllReduce and DDP's, in one backward)."""
    (s0, k0, trained0, top0), (s1, k1, trained1, top1) = run_multiprocess(_parallelized_under_overflow, 2)
    assert s0 == s1 and s0[0] == 2.0 ** 23 and s0[-1] < 2.0 ** 22
    assert 0 < k0 < STEPS and k1 == 0                          # rank 1 holds no shard
    assert trained0 and trained1                                # full_weights: every rank sees t0
    assert all(torch.equal(a, b) for a, b in zip(top0, top1))
