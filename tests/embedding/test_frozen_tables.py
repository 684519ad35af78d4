"""Freezing the tables, as on ``nn.EmbeddingBag``: ``requires_grad_(False)`` on the embedding module,
on a parent module (fine-tuning the rest), or ``requires_grad = False`` on the module's parameters.

Before, the tables (buffers updated inside the backward) went on training: the calls reached no
parameter. Now each reaches the module's ``autograd_anchor`` (``frozen``). The oracle: the tables
before the step (unchanged), the same step in ``eval()`` (the dense parameters move alike), and
after unfreezing the same update as a module never frozen.
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
TABLES = [TableConfig(k, ROWS, D, optimizer=OptimizerConfig("adagrad", lr=0.1)) for k in KEYS]


def batch(step: int, weights: bool = False):
    gen = torch.Generator().manual_seed(step)
    lengths = torch.randint(1, 4, (F * B,), generator=gen)
    ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
    w = torch.rand(ids.numel(), generator=gen).requires_grad_() if weights else None
    return torch.randn(B, 13, generator=gen), KeyedJaggedBatch(KEYS, ids, lengths, B, weights=w)


def model() -> DLRM:
    torch.manual_seed(0)
    return DLRM(TableBatchedEmbedding(TABLES, backend="cpu"), F, D, 13, [16, D], [16, 1])


def tables_of(m: DLRM):
    return [m.embedding.table_weight(k).clone() for k in KEYS]


def freeze(m: DLRM, how: str, requires_grad: bool) -> None:
    if how == "module":
        assert m.embedding.requires_grad_(requires_grad) is m.embedding
    elif how == "parent":                          # the whole model, then the dense layers back
        m.requires_grad_(requires_grad)
        for name, child in m.named_children():
            if name != "embedding":
                child.requires_grad_(True)
    else:                                          # the usual loop over the module's parameters
        for p in m.embedding.parameters():
            p.requires_grad = requires_grad


def dense_grads(m: DLRM):
    return [p.grad for n, p in m.named_parameters() if not n.startswith("embedding.")]


@pytest.mark.parametrize("how", ["module", "parent", "parameters"])
@pytest.mark.parametrize("sequence", [False, True])
def test_frozen_tables_stay_and_unfreeze(sequence, how):
    frozen, evaluated, never = model(), model(), model()
    start = tables_of(frozen)
    freeze(frozen, how, False)
    assert frozen.embedding.frozen
    evaluated.embedding.eval()
    dense, kjt = batch(0)
    for m in (frozen, evaluated):
        loss = m(dense, kjt).sum()
        if sequence:
            loss = loss + sum(s.values.sum() for s in m.embedding.sequence(kjt).values())
        loss.backward()
        assert all(torch.equal(a, b) for a, b in zip(tables_of(m), start))
    assert len(dense_grads(frozen)) > 2
    assert all(torch.equal(p, q) for p, q in zip(dense_grads(frozen), dense_grads(evaluated)))
    freeze(frozen, how, True)
    assert not frozen.embedding.frozen
    for m in (frozen, never):
        m(*batch(1)).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(tables_of(frozen), tables_of(never)))
    assert not torch.equal(tables_of(frozen)[0], start[0])


def test_frozen_tables_still_give_per_id_weights_their_gradient():
    frozen, live = model(), model()
    frozen.embedding.requires_grad_(False)
    dense, kjt = batch(2, weights=True)
    start = tables_of(frozen)
    grads = []
    for m in (frozen, live):
        w = kjt.weights.detach().clone().requires_grad_()
        m(dense, KeyedJaggedBatch(KEYS, kjt.values, kjt.lengths, B, weights=w)).sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-7)   # from the rows before the update
    assert all(torch.equal(a, b) for a, b in zip(tables_of(frozen), start))


def _sharded(rank: int, world_size: int):
    from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan

    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    plan = even_plan(TABLES, dict(zip(KEYS, ["table_wise", "column_wise", "row_wise"])), world_size, world_size)
    sec = ShardedEmbeddingCollection(TABLES, plan, pg, seed=1)
    probe = batch(50 + rank)[1]
    with torch.no_grad():
        before = sec(probe)
    holder = torch.nn.ModuleDict({"embedding": sec})   # frozen from a parent module
    holder.requires_grad_(False)
    sec(batch(rank)[1]).sum().backward()
    with torch.no_grad():
        after_frozen = sec(probe)
    holder.requires_grad_(True)
    sec(batch(rank)[1]).sum().backward()
    with torch.no_grad():
        after_live = sec(probe)
    return torch.equal(before, after_frozen), torch.equal(before, after_live)


def test_a_frozen_sharded_collection_stays_on_every_rank():
    assert run_multiprocess(_sharded, 2) == [(True, False), (True, False)]


def test_the_anchor_is_left_out_of_the_state_dict():
    m = model()
    m.embedding.requires_grad_(False)
    sd = m.state_dict()
    assert not any("autograd_anchor" in k for k in sd) and "embedding.t0.weight" in sd
    fresh = model()
    assert fresh.load_state_dict(sd, strict=True).missing_keys == []
    assert all(torch.equal(a, b) for a, b in zip(tables_of(fresh), tables_of(m)))


def test_a_module_pickled_before_the_anchor_loads_with_its_setting():
    m = model().embedding
    state = m.__getstate__()
    del state["_parameters"]["autograd_anchor"]    # as pickled by an older Neo, frozen set
    state["frozen"] = True
    old = TableBatchedEmbedding.__new__(TableBatchedEmbedding)
    old.__setstate__(state)
    assert old.frozen and isinstance(old.autograd_anchor, torch.nn.Parameter)
    old.frozen = False
    assert old.autograd_anchor.requires_grad
