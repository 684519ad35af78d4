"""Tables built on the meta device and materialized only as shards (TorchRec's pattern).

1. ``TableBatchedEmbedding(tables, device="meta")`` is a placeholder: its configs (tables,
   features, output columns) and no storage, so a table of 10^9 rows x 128 (512 GB in fp32)
   costs nothing; every use of the tables raises one RuntimeError naming the call and how to
   shard it.
2. W = 2: a user model built with a placeholder and put through ``parallelize(model, "ebc",
   plan, pg)`` (the plan a dict) trains bit for bit as the same model given a
   ``ShardedEmbeddingCollection(tables, plan, pg)`` built by hand, and as the unsharded model
   on the global batch started from the same tables (distributed_cases' oracle, to the
   equivalence tests' tolerance).
3. W = 2: ``parallelize(model, "ebc", plan, pg)`` on a real unsharded module keeps its weights
   (copied into the shards), and passes ``collection_kwargs`` to the collection.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable, Dict

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distributed_cases import (ALL_TYPES, Case, dense, global_batches, labels, local_slice, tables,
                               train_unsharded)
from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, parallelize
from neo.embedding import TableBatchedEmbedding
from tests.multiprocess import run_multiprocess

RTOL, ATOL = 1e-5, 1e-6          # as test_distributed_equivalence
W = 2
ACC0 = 0.1                       # Adagrad's state from 0.1, as in test_distributed_equivalence


def _case() -> Case:
    ts = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(1, 4))
    return Case("meta", ts, {t.name: ALL_TYPES[i % len(ALL_TYPES)] for i, t in enumerate(ts)}, W, W, steps=2)


def _pg() -> ProcessGroups:
    return ProcessGroups.build(W, timeout=datetime.timedelta(seconds=60))


class _UserModel(nn.Module):
    """The user's model: tables at ``ebc``, an MLP on top; no distributed code."""

    def __init__(self, case: Case, ebc: nn.Module):
        super().__init__()
        self.ebc = ebc
        self.top = dense(case)

    def forward(self, batch) -> torch.Tensor:
        return self.top(self.ebc(batch))


def _bce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), y)


# ---------------------------------------------------------------------- 1. the placeholder
def test_a_meta_placeholder_allocates_nothing_and_keeps_the_configs():
    big = [TableConfig("huge", num_rows=10**9, dim=128, feature_names=("user", "user_hist")),
           TableConfig("small", num_rows=10, dim=4)]
    start = time.perf_counter()
    m = TableBatchedEmbedding(big, device="meta")
    assert time.perf_counter() - start < 1.0                 # 512 GB in fp32 were it allocated
    assert m.is_meta
    assert sum(b.numel() for b in m.buffers()) == 0 and [p.numel() for p in m.parameters()] == [0]   # the anchor
    assert m.tables == big and m.feature_names == ["user", "user_hist", "small"]
    assert m.feature_dims == [128, 128, 4] and m.output_dim == 260
    assert m.feature_slices() == {"user": slice(0, 128), "user_hist": slice(128, 256), "small": slice(256, 260)}
    case = _case()
    real = TableBatchedEmbedding(case.tables)
    meta = TableBatchedEmbedding(case.tables, device=torch.device("meta"))
    assert (meta.feature_names, meta.feature_dims, meta.output_dim, meta.feature_slices()) == \
        (real.feature_names, real.feature_dims, real.output_dim, real.feature_slices())
    model = _UserModel(case, meta)
    assert "TableBatchedEmbedding" in repr(model)
    model.train()
    model.eval()


def test_a_meta_placeholder_checks_its_tables_as_a_real_module():
    t = TableConfig("a", num_rows=10, dim=4)
    with pytest.raises(ValueError, match="needs at least one table"):
        TableBatchedEmbedding([], device="meta")
    with pytest.raises(ValueError, match="table names repeat"):
        TableBatchedEmbedding([t, t], device="meta")
    with pytest.raises(ValueError, match="feature 'a' is read by tables 'a' and 'b'"):
        TableBatchedEmbedding([t, TableConfig("b", num_rows=10, dim=4, feature_names=("a",))], device="meta")
    with pytest.raises(ValueError, match="unknown embedding backend"):
        TableBatchedEmbedding([t], backend="nope", device="meta")


def _batch():
    return global_batches(_case())[0]


USES = [pytest.param(what, use, id=name) for name, what, use in [
    ("forward", "forward", lambda m: m(_batch())),
    ("keyed", "keyed", lambda m: m.keyed(_batch())),
    ("sequence", "sequence", lambda m: m.sequence(_batch())),
    ("state_dict", "state_dict", lambda m: m.state_dict()),
    ("load_state_dict", "load_state_dict", lambda m: m.load_state_dict({})),
    ("table_weight", "table_weight", lambda m: m.table_weight("t0")),
    ("table_optimizer_state", "table_optimizer_state", lambda m: m.table_optimizer_state("t0")),
    ("fused_optimizer", "fused_optimizer", lambda m: m.fused_optimizer),
    ("set_learning_rate", "set_learning_rate", lambda m: m.set_learning_rate(0.1)),
    ("set_learning_rates", "set_learning_rates", lambda m: m.set_learning_rates({"t0": 0.1})),
    ("optimizer_steps", "optimizer_steps", lambda m: m.optimizer_steps()),
    ("set_optimizer_steps", "set_optimizer_steps", lambda m: m.set_optimizer_steps(3)),
    ("skipped_ids", "skipped_ids", lambda m: m.skipped_ids),
    ("has_cache", "has_cache", lambda m: m.has_cache),
    ("prefetch", "prefetch", lambda m: m.prefetch(_batch())),
    ("flush_cache", "flush_cache", lambda m: m.flush_cache()),
    ("cache_stats", "cache_stats", lambda m: m.cache_stats()),
    ("to", "moving or converting it", lambda m: m.to("cpu")),
    ("to_empty", "moving or converting it", lambda m: m.to_empty(device="cpu")),
    ("model.to", "moving or converting it", lambda m: _UserModel(_case(), m).to(torch.device("cpu"))),
    ("float", "moving or converting it", lambda m: m.float()),
]]


@pytest.mark.parametrize("what, use", USES)
def test_every_use_of_the_tables_raises_saying_it_is_a_meta_placeholder(what: str, use: Callable):
    m = TableBatchedEmbedding(_case().tables, device="meta")
    with pytest.raises(RuntimeError) as e:
        use(m)
    msg = str(e.value)
    assert msg.startswith(f"TableBatchedEmbedding: {what}"), msg
    assert "device='meta'" in msg and "placeholder" in msg and "6 tables" in msg
    assert "parallelize(model, '<its attribute path>', plan, pg)" in msg and "ShardedEmbeddingCollection" in msg


def test_a_plan_needs_a_table_batched_embedding_at_the_path():
    case = _case()
    with pytest.raises(TypeError, match=r"model\.ebc must be a TableBatchedEmbedding .* it is a Identity"):
        parallelize(_UserModel(case, nn.Identity()), "ebc", case.plan(), None)


# ---------------------------------------------------------------------- 2. meta + plan == by hand == unsharded
def _train(model: nn.Module, ddp: nn.Module, case: Case, rank: int, pg: ProcessGroups) -> Dict[str, Any]:
    """``case.steps`` steps of the user's loop; the sharded tables' initial state too."""
    sec = model.ebc
    init = sec.full_weights()
    opt = torch.optim.SGD(ddp.parameters(), lr=case.dense_lr)
    B, local, mean = case.batch_size, [], []
    for batch, y in zip(global_batches(case), labels(case)):
        loss = _bce(ddp(local_slice(batch, rank, B)), y[rank * B:(rank + 1) * B])
        opt.zero_grad()
        loss.backward()
        opt.step()
        g = loss.detach().clone()
        dist.all_reduce(g, group=pg.world)
        local.append(loss.detach().clone())
        mean.append(float(g) / pg.world_size)
    return {"init": init, "local_losses": local, "losses": mean, "weights": sec.full_weights(),
            "states": sec.full_optimizer_state(), "dense": [p.detach().clone() for p in model.top.parameters()],
            "is_sharded": isinstance(sec, ShardedEmbeddingCollection)}


def _meta_vs_by_hand_worker(rank: int, world_size: int) -> Dict[str, Any]:
    pg, case = _pg(), _case()
    plan = case.plan()
    assert isinstance(plan, dict)
    meta = _UserModel(case, TableBatchedEmbedding(case.tables, device="meta"))
    via_plan = _train(meta, parallelize(meta, "ebc", plan, pg), case, rank, pg)
    by_hand_model = _UserModel(case, TableBatchedEmbedding(case.tables, device="meta"))
    sec = ShardedEmbeddingCollection(case.tables, plan, pg)
    by_hand = _train(by_hand_model, parallelize(by_hand_model, "ebc", sec, pg), case, rank, pg)
    return {"via_plan": via_plan, "by_hand": by_hand, "replaced": by_hand_model.ebc is sec}


def _train_oracle(case: Case, init: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """The unsharded model on the global batches, from the sharded run's initial tables."""
    model = _UserModel(case, TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed))
    with torch.no_grad():
        for name, w in init.items():
            model.ebc.table_weight(name).copy_(w)
    opt = torch.optim.SGD(model.top.parameters(), lr=case.dense_lr)
    return train_unsharded(model, model.ebc, model.top.parameters(), opt, case)


def test_meta_tables_sharded_by_a_plan_train_as_by_hand_and_as_the_unsharded_model():
    case = _case()
    got = run_multiprocess(_meta_vs_by_hand_worker, W)
    ref = _train_oracle(case, got[0]["by_hand"]["init"])
    for rank, out in enumerate(got):
        a, b = out["via_plan"], out["by_hand"]
        assert a["is_sharded"] and b["is_sharded"] and out["replaced"]
        # the same seed: the same shards, then the same steps, bit for bit
        for key in ("init", "weights"):
            assert a[key].keys() == b[key].keys() == {t.name for t in case.tables}
            for name in a[key]:
                assert torch.equal(a[key][name], b[key][name]), f"rank {rank}: {key} of {name}"
        assert all(torch.equal(x, y) for x, y in zip(a["local_losses"], b["local_losses"])), f"rank {rank}"
        assert a["losses"] == b["losses"]
        assert all(torch.equal(x, y) for x, y in zip(a["dense"], b["dense"]))
        for name in a["states"]:
            for k, v in a["states"][name].items():
                assert torch.equal(v, b["states"][name][k]), f"rank {rank}: {name}.{k}"
        # and the unsharded model on the global batch
        torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(ref["losses"]), rtol=RTOL, atol=ATOL)
        for name, w in ref["weights"].items():
            torch.testing.assert_close(a["weights"][name], w, rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"rank {rank} table {name}: {m}")
            for k, v in ref["states"][name].items():
                torch.testing.assert_close(a["states"][name][k], v, rtol=RTOL, atol=ATOL,
                                           msg=lambda m: f"rank {rank} {name}.{k}: {m}")
        for x, y in zip(a["dense"], ref["dense"]):
            torch.testing.assert_close(x, y, rtol=RTOL, atol=ATOL)
    assert got[0]["via_plan"]["losses"] == got[1]["via_plan"]["losses"]


# ---------------------------------------------------------------------- 3. a real module keeps its weights
def _real_module_worker(rank: int, world_size: int) -> Dict[str, Any]:
    pg, case = _pg(), _case()
    model = _UserModel(case, TableBatchedEmbedding(case.tables, seed=7))
    before = {t.name: model.ebc.table_weight(t.name).detach().clone() for t in case.tables}
    ddp = parallelize(model, "ebc", case.plan(), pg, collection_kwargs={"backend": "reference", "seed": 3})
    out = {"before": before, "after": model.ebc.full_weights(), "drift": model.ebc.replica_drift(),
           "backend": model.ebc.lookup.backend_name, "wrapped": ddp.module is model}
    with pytest.raises(TypeError, match="collection_kwargs are options of the collection built from a plan"):
        other = _UserModel(case, TableBatchedEmbedding(case.tables, device="meta"))
        parallelize(other, "ebc", model.ebc, pg, collection_kwargs={"backend": "reference"})
    with pytest.raises(ValueError, match="device='meta' is not a place for shards"):
        ShardedEmbeddingCollection(case.tables, case.plan(), pg, device="meta")
    return out


def test_a_plan_on_a_real_module_keeps_its_weights():
    got = run_multiprocess(_real_module_worker, W)
    for rank, out in enumerate(got):
        assert out["wrapped"] and out["backend"] == "reference" and out["drift"] == 0.0
        assert out["before"].keys() == out["after"].keys()
        for name, w in out["before"].items():
            assert torch.equal(out["after"][name], w), f"rank {rank}: table {name} lost its initialization"
