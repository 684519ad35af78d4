"""What a TorchRec user expects of the sharded collection, at W = 2 against single-process oracles.

1. A nested collection (``model.sparse_arch.embedding_bag_collection``, a TorchRec DLRM's
   layout) put through ``parallelize(model, "sparse_arch.embedding_bag_collection", ...)``:
   two steps with an Adam dense optimizer equal the unsharded model trained on the global
   batch (distributed_cases' oracle: losses, tables, optimizer state, dense weights); its
   state dict and checkpoint use the full dotted prefix, and the checkpoint reloads under
   another plan as saved.
2. ``sharded.fused_optimizer`` driven by a ``LambdaLR`` next to a dense optimizer on its own
   ``StepLR`` (``[dense_opt, fused]`` zeroed and stepped together) equals the unsharded run
   whose lrs are set by hand (``set_learning_rates`` with the schedule's values). Its groups
   are the global tables' on every rank, and ``step()`` is local (rank 0 steps it alone).
3. ``sharded.keyed(batch)`` (TorchRec's ``KeyedTensor``) under a plan of all six sharding
   types: each feature's columns equal ``nn.EmbeddingBag`` of its table on the rank's ids,
   ``regroup`` equals ``torch.cat`` of the pieces, and a loss on a regrouped piece trains the
   tables as the same gradient given to the full output does.
"""

from __future__ import annotations

import dataclasses
import datetime

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distributed_cases import (ALL_TYPES, Case, dense, global_batches, initial_tables, labels, local_slice, tables,
                               train_unsharded)
from neo.config.embedding import OptimizerConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, parallelize
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedEmbeddings
from neo.train.checkpoint import load_checkpoint, save_checkpoint
from neo.train.checkpoint.dcp_state import dense_state, embedding_prefixes
from tests.multiprocess import run_multiprocess

RTOL, ATOL = 1e-5, 1e-6
W = 2
PATH = "sparse_arch.embedding_bag_collection"
ACC0 = 0.1            # Adagrad's state from 0.1, as in test_distributed_equivalence (why: see there)


def _mixed(ts, shift: int = 0) -> dict:
    return {t.name: ALL_TYPES[(i + shift) % len(ALL_TYPES)] for i, t in enumerate(ts)}


def _pg() -> ProcessGroups:
    return ProcessGroups.build(W, timeout=datetime.timedelta(seconds=60))


def _bce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), y)


def _mean_over_ranks(loss: torch.Tensor, pg: ProcessGroups) -> float:
    g = loss.detach().clone()
    dist.all_reduce(g, group=pg.world)
    return float(g) / pg.world_size


def _assert_trained_alike(got: dict, ref: dict, what: str) -> None:
    msg = lambda part: (lambda m: f"[{what}] {part}: {m}")  # noqa: E731
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=RTOL, atol=ATOL,
                               msg=msg("losses"))
    for name, w in ref["weights"].items():
        torch.testing.assert_close(got["weights"][name], w, rtol=RTOL, atol=ATOL, msg=msg(f"table {name}"))
        for k, v in ref["states"][name].items():
            torch.testing.assert_close(got["states"][name][k], v, rtol=RTOL, atol=ATOL, msg=msg(f"{name}.{k}"))
    assert len(got["dense"]) == len(ref["dense"]) == 4
    for i, (a, b) in enumerate(zip(got["dense"], ref["dense"])):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=msg(f"dense parameter {i}"))


# ---------------------------------------------------------------------- 1. a nested collection
class _SparseArch(nn.Module):
    def __init__(self, ebc: nn.Module):
        super().__init__()
        self.embedding_bag_collection = ebc

    def forward(self, batch) -> torch.Tensor:
        return self.embedding_bag_collection(batch)


class _NestedModel(nn.Module):
    """TorchRec's DLRM layout: the tables at ``model.sparse_arch.embedding_bag_collection``."""

    def __init__(self, case: Case):
        super().__init__()
        self.sparse_arch = _SparseArch(TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed))
        self.over = dense(case)

    def forward(self, batch) -> torch.Tensor:
        return self.over(self.sparse_arch(batch))


def _nested_case(types_shift: int = 0) -> Case:
    ts = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(1, 4))
    return Case(f"nested, shift {types_shift}", ts, _mixed(ts, types_shift), W, W, steps=2)


def _train_nested_reference(case: Case) -> dict:
    model = _NestedModel(case)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return train_unsharded(model, model.sparse_arch.embedding_bag_collection, model.over.parameters(), opt, case)


def _build_nested(case: Case, pg: ProcessGroups):
    model = _NestedModel(case)                                # the user's model, built unsharded
    sec = ShardedEmbeddingCollection(case.tables, case.plan(), pg, seed=case.seed)
    unsharded = model.sparse_arch.embedding_bag_collection
    sec.load_full_weights({t.name: unsharded.table_weight(t.name) for t in case.tables})
    ddp = parallelize(model, PATH, sec, pg)
    return model, sec, ddp, torch.optim.Adam(ddp.parameters(), lr=0.01)


def _nested_worker(rank: int, world_size: int, root: str) -> dict:
    pg = _pg()
    case, other = _nested_case(), _nested_case(types_shift=1)
    model, sec, ddp, opt = _build_nested(case, pg)
    B = case.batch_size
    losses = []
    for batch, y in zip(global_batches(case), labels(case)):
        loss = _bce(ddp(local_slice(batch, rank, B)), y[rank * B:(rank + 1) * B])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(_mean_over_ranks(loss, pg))
    out = {"losses": losses, "weights": sec.full_weights(), "states": sec.full_optimizer_state(),
           "dense": [p.detach().clone() for p in model.over.parameters()],
           "replaced": model.sparse_arch.embedding_bag_collection is sec,
           "ignored": sorted(model._ddp_params_and_buffers_to_ignore),
           "sec_buffers": sorted(f"{PATH}.{n}" for n, _ in [*sec.named_buffers(), *sec.named_parameters()]),
           "ddp_params": sorted(n for n, _ in ddp.module.named_parameters() if n not in ddp.parameters_to_ignore),
           "state_keys": sorted(model.state_dict()), "prefixes": embedding_prefixes(model),
           "dense_keys": sorted(dense_state(model, opt)["model"])}
    # the checkpoint of the nested model reloads into another nested model under another plan
    path = save_checkpoint(root, 2, sharded=sec, dense_model=model, optimizer=opt, loader_state={}, pg=pg)
    model2, sec2, _, opt2 = _build_nested(other, pg)
    load_checkpoint(path, sharded=sec2, dense_model=model2, optimizer=opt2, loader=None, pg=pg)
    out["reloaded"] = {"weights": sec2.full_weights(), "states": sec2.full_optimizer_state(),
                       "dense": [p.detach().clone() for p in model2.over.parameters()],
                       "adam": opt2.state_dict()["state"]}
    out["adam"] = opt.state_dict()["state"]
    return out


def test_a_nested_collection_trains_as_the_unsharded_model_and_checkpoints_by_its_dotted_prefix(tmp_path):
    case = _nested_case()
    ref = _train_nested_reference(case)
    got = run_multiprocess(_nested_worker, W, str(tmp_path / "ck"))
    names = [t.name for t in case.tables]
    for rank, out in enumerate(got):
        _assert_trained_alike(out, ref, f"rank {rank}")
        assert out["replaced"], f"rank {rank}: the nested attribute was not replaced"
        assert out["ignored"] == out["sec_buffers"] and out["ignored"], "DDP must ignore the shards by their full path"
        assert out["ddp_params"] == ["over.0.bias", "over.0.weight", "over.2.bias", "over.2.weight"]
        assert out["prefixes"][0] == f"{PATH}." and all(p.startswith(f"{PATH}.") for p in out["prefixes"])
        for t in names:
            assert f"{PATH}.{t}.weight" in out["state_keys"] and f"{PATH}.{t}.sum" in out["state_keys"]
        assert out["dense_keys"] == ["over.0.bias", "over.0.weight", "over.2.bias", "over.2.weight"]
        r = out["reloaded"]
        for t in names:
            assert torch.equal(r["weights"][t], out["weights"][t]), f"rank {rank}: table {t} reloaded differs"
            for k, v in out["states"][t].items():
                assert torch.equal(r["states"][t][k], v), f"rank {rank}: {t}.{k} reloaded differs"
        assert all(torch.equal(a, b) for a, b in zip(r["dense"], out["dense"]))
        assert r["adam"].keys() == out["adam"].keys() and r["adam"]
        for i in out["adam"]:
            assert all(torch.equal(torch.as_tensor(out["adam"][i][k]), torch.as_tensor(r["adam"][i][k]))
                       for k in out["adam"][i])


def test_a_missing_path_component_is_named():
    case = _nested_case()
    with pytest.raises(AttributeError, match=r"'sparse_arch\.ebc'.*sparse_arch has no attribute 'ebc'"):
        parallelize(_NestedModel(case), "sparse_arch.ebc", None, None)
    with pytest.raises(AttributeError,
                       match=r"'sparse\.embedding_bag_collection'.*the model has no attribute 'sparse'"):
        parallelize(_NestedModel(case), "sparse.embedding_bag_collection", None, None)
    with pytest.raises(AttributeError, match=r"sparse_arch\.training is a bool, not a module"):
        parallelize(_NestedModel(case), "sparse_arch.training.x", None, None)
    with pytest.raises(AttributeError, match="not an attribute path"):
        parallelize(_NestedModel(case), "sparse_arch..x", None, None)


# ---------------------------------------------------------------------- 2. fused optimizer + schedulers
LAMBDAS = (lambda e: 0.5 ** e, lambda e: 1.0 + 0.5 * e)          # per group: sgd tables, adagrad tables
DENSE_GAMMA = 0.7


def _schedule_case() -> Case:
    sgd, ada = OptimizerConfig("sgd", lr=0.5), OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0)
    ts = [dataclasses.replace(t, optimizer=sgd if i % 2 == 0 else ada) for i, t in enumerate(tables(6, mean=(3,)))]
    return Case("schedule", ts, _mixed(ts), W, W, steps=3)


def _train_schedule_reference(case: Case) -> dict:
    """Unsharded; the tables' lrs set by hand to the schedule's values before every step."""
    emb = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
    mlp = dense(case)
    opt = torch.optim.SGD(mlp.parameters(), lr=case.dense_lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=DENSE_GAMMA)
    losses = []
    for k, (batch, y) in enumerate(zip(global_batches(case), labels(case))):
        emb.set_learning_rates({t.name: t.optimizer.lr * LAMBDAS[i % 2](k) for i, t in enumerate(case.tables)})
        loss = _bce(mlp(emb(batch)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "weights": {t.name: emb.table_weight(t.name).clone() for t in case.tables},
            "states": {t.name: {k: v.clone() for k, v in emb.table_optimizer_state(t.name).items()}
                       for t in case.tables},
            "dense": [p.detach().clone() for p in mlp.parameters()]}


class _UserModel(nn.Module):
    def __init__(self, case: Case):
        super().__init__()
        self.ebc = nn.Identity()
        self.top = dense(case)

    def forward(self, batch) -> torch.Tensor:
        return self.top(self.ebc(batch))


def _schedule_worker(rank: int, world_size: int) -> dict:
    pg = _pg()
    case = _schedule_case()
    sec = ShardedEmbeddingCollection(case.tables, case.plan(), pg, seed=case.seed)
    sec.load_full_weights(initial_tables(case))
    model = _UserModel(case)
    ddp = parallelize(model, "ebc", sec, pg)
    dense_opt = torch.optim.SGD(ddp.parameters(), lr=case.dense_lr)
    fused = model.ebc.fused_optimizer
    groups = fused.state_dict()["param_groups"]
    opts = [dense_opt, fused]
    scheds = [torch.optim.lr_scheduler.StepLR(dense_opt, step_size=1, gamma=DENSE_GAMMA),
              torch.optim.lr_scheduler.LambdaLR(fused, list(LAMBDAS))]
    B, losses, lrs = case.batch_size, [], []
    for batch, y in zip(global_batches(case), labels(case)):
        lrs.append([g["lr"] for g in fused.param_groups])
        for o in opts:
            o.zero_grad()
        loss = _bce(ddp(local_slice(batch, rank, B)), y[rank * B:(rank + 1) * B])
        loss.backward()
        for o in opts:
            o.step()
        if rank == 0:
            fused.step()               # local: were it a collective, rank 1's next one would not match it
        for s in scheds:
            s.step()
        losses.append(_mean_over_ranks(loss, pg))
    return {"losses": losses, "weights": sec.full_weights(), "states": sec.full_optimizer_state(),
            "dense": [p.detach().clone() for p in model.top.parameters()], "groups": groups, "lrs": lrs,
            "n_params": [len(g["params"]) for g in fused.param_groups],
            "is_optimizer": isinstance(fused, torch.optim.Optimizer)}


def test_schedulers_drive_the_sharded_fused_optimizer_next_to_a_dense_one():
    case = _schedule_case()
    ref = _train_schedule_reference(case)
    got = run_multiprocess(_schedule_worker, W)
    sgd_tables = [t.name for i, t in enumerate(case.tables) if i % 2 == 0]
    ada_tables = [t.name for i, t in enumerate(case.tables) if i % 2 == 1]
    for rank, out in enumerate(got):
        assert out["is_optimizer"]
        assert out["groups"] == [{"lr": 0.5, "tables": sgd_tables}, {"lr": 0.3, "tables": ada_tables}], \
            f"rank {rank}: the groups are the global tables' on every rank"
        assert out["lrs"] == [[0.5 * LAMBDAS[0](k), 0.3 * LAMBDAS[1](k)] for k in range(case.steps)]
        _assert_trained_alike(out, ref, f"rank {rank}")
    assert sum(sum(out["n_params"]) for out in got) >= len(case.tables)       # every rank's shards, together


# ---------------------------------------------------------------------- 3. keyed output
GROUPS = [["f3b", "f0a"], ["f2"], ["f1", "f2", "f3a"], ["f5", "f4", "f0b"]]
GRAD_GROUP = ["f5", "f0a", "f2"]        # tables t5 table_column_wise, t0 data_parallel, t2 row_wise


def _keyed_case() -> Case:
    ts = tables(6, mean=(1,))
    return Case("keyed", ts, _mixed(ts), W, W, steps=1)


def _keyed_worker(rank: int, world_size: int) -> dict:
    pg = _pg()
    case = _keyed_case()
    a, b = (ShardedEmbeddingCollection(case.tables, case.plan(), pg, seed=case.seed) for _ in range(2))
    for sec in (a, b):
        sec.load_full_weights(initial_tables(case))
    local = local_slice(global_batches(case)[0], rank, case.batch_size)
    kt = a.keyed(local)
    out = {"slices": a.feature_slices(), "pieces": {k: v.detach().clone() for k, v in kt.to_dict().items()},
           "regrouped": [x.detach().clone() for x in kt.regroup(GROUPS)], "keys": kt.keys()}
    # gradient through a regrouped piece (a) == the same gradient in those columns of the full output (b)
    gen = torch.Generator().manual_seed(50 + rank)
    piece, = kt.regroup([GRAD_GROUP])
    g = torch.randn(piece.shape, generator=gen)
    (piece * g).sum().backward()
    full = b(local)
    grad, c = torch.zeros_like(full), 0
    for f in GRAD_GROUP:
        cols = b.feature_slices()[f]
        n = cols.stop - cols.start
        grad[:, cols] = g[:, c:c + n]
        c += n
    full.backward(grad)
    out["a"], out["b"] = a.full_weights(), b.full_weights()
    return out


def _rates_on_every_rank(rank: int, world_size: int) -> dict:
    pg = _pg()
    ts = [dataclasses.replace(t, optimizer=OptimizerConfig("sgd", lr=0.1 * (k + 1))) for k, t in enumerate(tables(2))]
    sec = ShardedEmbeddingCollection(ts, Case("tw", ts, {t.name: "table_wise" for t in ts}, world_size, W).plan(), pg)
    held = sorted({s.rank for t in ts for s in sec.plan.tables[t.name].shards if s.rank == rank})
    sec.set_learning_rates({"t0": 0.7})                 # before the optimizer exists; rank 1 holds no t0
    opt = sec.fused_optimizer
    first = opt.learning_rates()
    sec.set_learning_rates({"t1": 0.05})                # after: the groups follow
    with pytest.raises(ValueError, match="no table 'nope'"):
        sec.set_learning_rates({"nope": 1.0})
    return {"held": held, "first": first, "then": opt.learning_rates(), "saved": opt.state_dict()["param_groups"]}


def test_every_rank_keeps_every_groups_rate():
    """A group's lr is the collection's on every rank, shards of it or not: set before the fused
    optimizer exists or after, the ranks' groups (and so a state_dict saved on any rank) agree."""
    got = run_multiprocess(_rates_on_every_rank, W)
    for out in got:
        assert out["first"] == {"t0": 0.7, "t1": 0.2} and out["then"] == {"t0": 0.7, "t1": 0.05}, out
    assert got[0]["saved"] == got[1]["saved"]


def _embedding_bag(weight: torch.Tensor, mode: str, batch, feature: str) -> torch.Tensor:
    values, lengths, _ = batch.feature(feature)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    return nn.EmbeddingBag.from_pretrained(weight, mode=mode)(values, offsets)


def test_keyed_output_of_a_sharded_collection_is_each_features_embedding_bag():
    case = _keyed_case()
    assert {case.types[f"t{i}"] for i in range(6)} == set(ALL_TYPES)
    got = run_multiprocess(_keyed_worker, W)
    init = initial_tables(case)
    unsharded = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
    table_of = {f: t for t in case.tables for f in t.feature_names}
    for rank, out in enumerate(got):
        assert out["slices"] == unsharded.feature_slices()
        assert out["keys"] == unsharded.feature_names
        local = local_slice(global_batches(case)[0], rank, case.batch_size)
        for f, piece in out["pieces"].items():
            t = table_of[f]
            torch.testing.assert_close(piece, _embedding_bag(init[t.name], t.pooling.value, local, f),
                                       rtol=RTOL, atol=ATOL, msg=lambda m: f"rank {rank} feature {f}: {m}")
        for group, x in zip(GROUPS, out["regrouped"]):
            assert torch.equal(x, torch.cat([out["pieces"][f] for f in group], dim=1)), f"rank {rank} {group}"
        moved = set()
        for name, w in out["b"].items():
            torch.testing.assert_close(out["a"][name], w, rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"rank {rank} table {name}: {m}")
            if not torch.equal(w, init[name]):
                moved.add(name)
        assert moved == {table_of[f].name for f in GRAD_GROUP}, moved
    keyed = KeyedEmbeddings(got[0]["keys"], [s.stop - s.start for s in got[0]["slices"].values()],
                            torch.cat(list(got[0]["pieces"].values()), dim=1))
    assert torch.equal(keyed["f2"], got[0]["pieces"]["f2"])
