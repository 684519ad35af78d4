"""A user's own model around a sharded collection, under any attribute name (``parallelize(model,
"ebc", ...)``), checkpointed with neo.train.checkpoint from the user's own loop: the tables are saved
by table (not as the rank's dense tensors), so the checkpoint loads under another plan with every
weight, optimizer state and dense parameter as saved (found by a TorchRec-user walkthrough of
2026-11-29: only an attribute named ``embedding`` worked)."""

from __future__ import annotations

import datetime

import pytest
import torch
from torch import nn

from distributed_cases import ALL_TYPES, Case, global_batches, initial_tables, local_slice, tables
from neo.config.embedding import OptimizerConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, parallelize
from neo.train.checkpoint import load_checkpoint, save_checkpoint
from tests.multiprocess import run_multiprocess


class _UserModel(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ebc = nn.Identity()                 # replaced by the sharded collection
        self.top = nn.Linear(dim, 1)

    def forward(self, batch):
        return self.top(self.ebc(batch))


def _save_then_load_under_another_plan(rank: int, world_size: int, root: str, n_tables: int):
    pg = ProcessGroups.build(2, timeout=datetime.timedelta(seconds=60))
    ts = tables(n_tables, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=0.1))
    first = Case("table-wise", ts, {t.name: "table_wise" for t in ts}, world_size, 2)
    second = Case("mixed", ts, {t.name: ALL_TYPES[(i + 1) % len(ALL_TYPES)] for i, t in enumerate(ts)}, world_size, 2)
    dim = sum(t.dim * len(t.feature_names) for t in ts)

    def build(case):
        torch.manual_seed(5)
        sec = ShardedEmbeddingCollection(ts, case.plan(), pg)
        sec.load_full_weights(initial_tables(case))
        model = parallelize(_UserModel(dim), "ebc", sec, pg)
        return sec, model, torch.optim.Adam(model.parameters(), lr=0.01)

    sec, model, opt = build(first)
    for batch in global_batches(first)[:2]:
        loss = model(local_slice(batch, rank, first.batch_size)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = save_checkpoint(root, 2, sharded=sec, dense_model=model.module, optimizer=opt, loader_state={}, pg=pg)
    sec2, model2, opt2 = build(second)
    load_checkpoint(path, sharded=sec2, dense_model=model2.module, optimizer=opt2, loader=None, pg=pg)
    dense = lambda m: [p.detach().clone() for p in m.module.top.parameters()]        # noqa: E731
    return {"saved": (sec.full_weights(), sec.full_optimizer_state(), dense(model), opt.state_dict()["state"]),
            "loaded": (sec2.full_weights(), sec2.full_optimizer_state(), dense(model2), opt2.state_dict()["state"])}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("n_tables", [4, 1])     # 1: table-wise, rank 1 holds no shard when saving
def test_a_users_model_reloads_under_another_plan_whatever_its_attribute(tmp_path, n_tables):
    got = run_multiprocess(_save_then_load_under_another_plan, 2, str(tmp_path / "ck"), n_tables)
    for rank, out in enumerate(got):
        weights, states, dense, adam = out["saved"]
        assert _equal(out["loaded"], out["saved"]), f"rank {rank}: the loaded model differs from the saved one"
        assert weights and states and len(dense) == 2 and adam                 # there was something to compare
