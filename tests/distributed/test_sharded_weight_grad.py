"""Per-id weights that require grad through a sharded collection (TorchRec's position-weighted
features, sharded): their gradient comes back from the shards to the source ranks.

The oracle is the unsharded module (``backend="reference"``, itself checked against plain
PyTorch in tests/embedding/test_weight_grad.py) on the global batch: rank r's samples are
r*B .. (r+1)*B-1 of it. Each rank's loss is ``(out_r * G_r).sum()`` for a fixed random G, the
oracle's the mean over the ranks of those (the collection's ``average_gradients``), so the
tables' updates agree and each rank's weights take the gradient of its own loss: W times the
oracle's gradient of its slice of the weights. Checked per id, under every sharding type, a
mixed plan, a plan leaving a rank without shards, on one host and on two (the hierarchical
output distributions; gloo carries the collectives, as the overflow agreement of a loss scaler,
checked in the same backward), over two steps (the second from the first's updated rows), and at
world size 1 (the one-rank path); a variable-batch KeyedJaggedTensor (VBE) per rank. Then whole
training runs (distributed_cases) with learnable position weights (:class:`neo.embedding.PositionWeights`)
under DDP, against the same oracle; and weights read at lookup time from a ``weight_table``, its
values changed between the distribution and the lookup, against the oracle with the changed ones.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict

import pytest
import torch

from distributed_cases import ALL_TYPES, Case, dense, position_weights, tables, train_reference, train_sharded
from neo.config.embedding import OptimizerConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.distributed.input_dist import DistributedInputError
from neo.embedding import PositionWeights, TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

B, STEPS = 5, 2
OPT = OptimizerConfig("adagrad", lr=0.2, initial_accumulator_value=0.1)   # per element: the same under column splits


def _tables():
    return tables(4, OPT, mean=(1,))


def _global(step: int, W: int, ts) -> tuple:
    """(batch of W * B samples with weights, G (W * B, sum D))."""
    gen = torch.Generator().manual_seed(500 + step)
    keys, values, lengths = [], [], []
    for t in ts:
        for f in t.feature_names:
            lens = torch.randint(0, 4, (W * B,), generator=gen)
            lens[0].clamp_(min=1)       # every feature has ids: each position weight gets a gradient
            ids = torch.randint(0, t.num_rows, (int(lens.sum()),), generator=gen)
            ids[torch.rand(ids.numel(), generator=gen) < 0.3] = 1                 # repeated rows
            keys.append(f)
            values.append(ids)
            lengths.append(lens)
    v = torch.cat(values)
    w = torch.rand(v.numel(), generator=gen) + 0.5
    D = sum(t.dim * len(t.feature_names) for t in ts)
    return KeyedJaggedBatch(tuple(keys), v, torch.cat(lengths), W * B, weights=w), \
        torch.randn(W * B, D, generator=gen)


def _slice(batch: KeyedJaggedBatch, r: int) -> KeyedJaggedBatch:
    GB = batch.batch_size
    vals, lens, ws = [], [], []
    for f in range(len(batch.keys)):
        a, b = int(batch.offsets[f * GB + r * B]), int(batch.offsets[f * GB + (r + 1) * B])
        vals.append(batch.values[a:b])
        ws.append(batch.weights[a:b])
        lens.append(batch.lengths[f * GB + r * B:f * GB + (r + 1) * B])
    return KeyedJaggedBatch(batch.keys, torch.cat(vals), torch.cat(lens), B, weights=torch.cat(ws))


def _plans(W: int, L: int, ts) -> Dict[str, Any]:
    names = [t.name for t in ts]
    plans = {st: even_plan(ts, {n: st for n in names}, W, L) for st in ALL_TYPES}
    mixed = ["table_wise", "row_wise", "column_wise", "data_parallel"]
    plans["mixed"] = even_plan(ts, dict(zip(names, mixed)), W, L)
    if W > 1:       # every table on rank 0: the other ranks hold no shard
        plans["rank without shards"] = even_plan(ts, {n: "table_wise" for n in names}, W, L,
                                                 ranks={n: 0 for n in names})
    return plans


def _worker(rank: int, world_size: int, L: int, scaled: bool) -> Dict[str, Any]:
    ts = _tables()
    pg = ProcessGroups.build(L, timeout=datetime.timedelta(seconds=60))
    out: Dict[str, Any] = {}
    for name, plan in _plans(world_size, L, ts).items():
        sec = ShardedEmbeddingCollection(ts, plan, pg, seed=3)
        scaler = None
        if scaled:       # the ranks' overflow agreement (an AllReduce on the world group) in the same backward
            scaler = sec.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        grads, outs = [], []
        for step in range(STEPS):
            batch, G = _global(step, world_size, ts)
            local = _slice(batch, rank)
            w = local.weights.clone().requires_grad_()
            o = sec(KeyedJaggedBatch(local.keys, local.values, local.lengths, B, weights=w))
            loss = (o * G[rank * B:(rank + 1) * B]).sum()
            (loss if scaler is None else scaler.scale(loss)).backward()
            grads.append(w.grad if scaler is None else w.grad / scaler.get_scale())
            outs.append(o.detach())
        out[name] = {"grads": grads, "outs": outs, "tables": sec.full_weights()}
    # the weights require grad on rank 0 only: every rank raises, naming the cause, and nobody hangs
    if world_size > 1:
        sec = ShardedEmbeddingCollection(ts, _plans(world_size, L, ts)["mixed"], pg, seed=3)
        local = _slice(_global(0, world_size, ts)[0], rank)
        local.weights.requires_grad_(rank == 0)
        try:
            sec(local)
            out["mismatch"] = None
        except DistributedInputError as e:
            out["mismatch"] = str(e)
    return out


def _oracle(W: int) -> Dict[str, Any]:
    ts = _tables()
    emb = TableBatchedEmbedding(ts, backend="reference", seed=3)
    grads, outs = [], []
    for step in range(STEPS):
        batch, G = _global(step, W, ts)
        w = batch.weights.clone().requires_grad_()
        o = emb(KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, W * B, weights=w))
        ((o * G).sum() / W).backward()
        grads.append(w.grad * W)                   # each rank's own loss: W times the mean's gradient
        outs.append(o.detach())
    return {"grads": grads, "outs": outs, "tables": {t.name: emb.table_weight(t.name).detach().clone() for t in ts}}


def _slice_grad(batch: KeyedJaggedBatch, g: torch.Tensor, r: int) -> torch.Tensor:
    return _slice(KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, batch.batch_size, weights=g), r).weights


@pytest.mark.parametrize("W,L,scaled", [(1, 1, False), (2, 2, False), (2, 1, False), (2, 1, True)],
                         ids=["one rank", "one host", "two hosts", "two hosts, a loss scaler"])
def test_weight_grad_comes_back_from_the_shards(W, L, scaled):
    got = run_multiprocess(_worker, W, L, scaled, local_world_size=L, collective_timeout_s=30)
    ref = _oracle(W)
    ts = _tables()
    for name in _plans(W, L, ts):
        for step in range(STEPS):
            batch, _ = _global(step, W, ts)
            for r in range(W):
                res = got[r][name]
                torch.testing.assert_close(res["outs"][step], ref["outs"][step][r * B:(r + 1) * B],
                                           rtol=1e-5, atol=1e-6, msg=f"[{name}] rank {r} step {step} output")
                want = _slice_grad(batch, ref["grads"][step], r)
                assert res["grads"][step] is not None, f"[{name}] rank {r}: no gradient of the weights"
                torch.testing.assert_close(res["grads"][step], want, rtol=1e-5, atol=1e-6,
                                           msg=f"[{name}] rank {r} step {step} weights' gradient")
        for t, w in ref["tables"].items():
            torch.testing.assert_close(got[0][name]["tables"][t], w, rtol=1e-5, atol=1e-6,
                                       msg=f"[{name}] table {t}")
    for r in range(1, W):
        err = got[r]["mismatch"]
        assert err is not None and "require grad on rank(s) [0] and not on the others" in err, err


def test_position_weights_train_as_unsharded():
    """Two ranks train a mixed plan and a data-parallel one with learnable position weights
    before the lookup (dense parameters under DDP): losses, tables, optimizer state, the MLP and
    the position weights as the unsharded module trains them on the global batches."""
    from test_distributed_equivalence import ACC0, _check

    ts = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(1, 4))
    mixed = dict(zip([t.name for t in ts], ["table_wise", "row_wise", "column_wise", "table_row_wise",
                                            "table_column_wise", "data_parallel"]))
    cases = [Case("position weights, mixed", ts, mixed, 2, 2, learnable_weights=True),
             Case("position weights, data_parallel", ts, {t.name: "data_parallel" for t in ts}, 2, 2,
                  learnable_weights=True)]
    got = run_multiprocess(train_sharded, 2, cases, local_world_size=2, collective_timeout_s=30)
    for k, case in enumerate(cases):
        ref = train_reference(case)
        n_mlp = len(list(dense(case).parameters()))
        start = [p.detach() for p in position_weights(case).parameters()]
        trained = ref["dense"][n_mlp:]
        assert len(trained) == len(start) == 8
        assert all(bool((a - b).abs().max() > 1e-5) for a, b in zip(trained, start)), "position weights did not train"
        _check(case, got[0][k])
        for r in range(2):
            for j, want in enumerate(trained):
                torch.testing.assert_close(got[r][k]["dense"][n_mlp + j], want, rtol=1e-5, atol=1e-6,
                                           msg=f"[{case.name}] rank {r}: position weights {j}")


def _vbe_worker(rank: int, world_size: int) -> Dict[str, Any]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ts = tables(2, OptimizerConfig("sgd", lr=0.1))
    names = [f for t in ts for f in t.feature_names]
    pg = ProcessGroups.build(world_size, timeout=datetime.timedelta(seconds=60))
    gen = torch.Generator().manual_seed(10 + rank)
    counts = [3, 2, 4]                              # each feature's own batch size on this rank
    lengths = torch.cat([torch.randint(0, 4, (n,), generator=gen) for n in counts])
    parts, lo = [], 0
    for t, f, n in zip([ts[0], ts[0], ts[1]], names, counts):
        k = int(lengths[lo:lo + n].sum())
        parts.append(torch.randint(0, t.num_rows, (k,), generator=gen))
        lo += n
    values, w0 = torch.cat(parts), torch.rand(int(lengths.sum()), generator=gen) + 0.5
    inverse = torch.tensor([[0, 1, 2, 1], [0, 1, 1, 0], [3, 2, 1, 0]])        # (F, B 4): each sample's bag

    def kjt(w):
        return KeyedJaggedTensor(keys=names, values=values, lengths=lengths, weights=w,
                                 stride_per_key_per_rank=[[n] for n in counts], inverse_indices=(names, inverse))

    out = {}
    for kind in ("table_wise", "row_wise", "column_wise", "data_parallel"):
        sec = ShardedEmbeddingCollection(ts, even_plan(ts, {t.name: kind for t in ts}, world_size, world_size), pg,
                                         seed=2)
        ref = TableBatchedEmbedding(ts, backend="reference", seed=2)
        got = []
        for emb in (sec, ref):      # the tables are the same before the backward: each rank's own loss
            w = w0.clone().requires_grad_()
            o = emb(kjt(w))
            (o * torch.linspace(-1.0, 1.0, o.numel()).view_as(o)).sum().backward()
            got.append((o.detach(), w.grad))
        out[kind] = got
    return out


def test_variable_batch_weights_get_their_gradient():
    """A variable-batch KeyedJaggedTensor (VBE) whose weights require grad: the sharded collection
    pads its bags, routes the weights and returns their gradient as the unsharded module computes
    it on the same rank's batch."""
    pytest.importorskip("torchrec.sparse.jagged_tensor")
    got = run_multiprocess(_vbe_worker, 2, collective_timeout_s=30)
    for r, res in enumerate(got):
        for kind, ((o, g), (o_ref, g_ref)) in res.items():
            torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-6, msg=f"[{kind}] rank {r} output")
            assert g is not None and bool(g.abs().sum() > 0), (kind, r)
            torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6, msg=f"[{kind}] rank {r} weights' gradient")


def _pw(ts) -> PositionWeights:
    pw = PositionWeights({f: 4 for t in ts for f in t.feature_names})
    with torch.no_grad():
        for k, p in enumerate(pw.parameters()):
            p.copy_(torch.linspace(0.5, 1.5, 4) + 0.1 * k)
    return pw


def _deferred_worker(rank: int, world_size: int, L: int) -> Dict[str, Any]:
    ts = _tables()
    pg = ProcessGroups.build(L, timeout=datetime.timedelta(seconds=60))
    out: Dict[str, Any] = {}
    for name, plan in _plans(world_size, L, ts).items():
        sec = ShardedEmbeddingCollection(ts, plan, pg, seed=3)
        pw = _pw(ts)
        sec.weight_table = pw
        steps = []
        for step in range(STEPS):
            batch, G = _global(step, world_size, ts)
            local = _slice(batch, rank)
            aw = sec.input_dist(KeyedJaggedBatch(local.keys, local.values, local.lengths, B))   # weighted at the lookup
            with torch.no_grad():                             # the weights change in between: the lookup's count
                for p in pw.parameters():
                    p.mul_(1.25)
            db = aw.wait()
            o = sec.output_dist(sec.compute(db), db).wait()
            (o * G[rank * B:(rank + 1) * B]).sum().backward()
            steps.append((o.detach(), [p.grad.clone() for p in pw.parameters()]))
            pw.zero_grad()
        out[name] = steps
    if world_size > 1:       # weight_table on rank 0 only, then weights of its own on rank 1: every rank raises
        local = _slice(_global(0, world_size, ts)[0], rank)
        unweighted = KeyedJaggedBatch(local.keys, local.values, local.lengths, B)
        for case, fn, batch in [("mismatch", _pw(ts) if rank == 0 else None, unweighted),
                                ("own weights", _pw(ts), local if rank == 1 else unweighted)]:
            sec = ShardedEmbeddingCollection(ts, _plans(world_size, L, ts)["mixed"], pg, seed=3)
            sec.weight_table = fn
            try:
                sec(batch)
                out[case] = None
            except DistributedInputError as e:
                out[case] = str(e)
    return out


@pytest.mark.parametrize("W,L", [(1, 1), (2, 2), (2, 1)], ids=["one rank", "one host", "two hosts"])
def test_weights_made_at_lookup_time(W, L):
    """``weight_table`` (learnable position weights): the batch is distributed first, its weights read
    when it is looked up, from the table as it is then (changed in between here); each rank's
    gradient of the table, averaged over the ranks (as DDP does), is the unsharded module's on the
    global batch with the global mean loss; the outputs are its too."""
    got = run_multiprocess(_deferred_worker, W, L, local_world_size=L, collective_timeout_s=30)
    ts = _tables()
    emb, pw = TableBatchedEmbedding(ts, backend="reference", seed=3), _pw(ts)
    for step in range(STEPS):
        batch, G = _global(step, W, ts)
        with torch.no_grad():
            for p in pw.parameters():
                p.mul_(1.25)
        o = emb(pw(KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, batch.batch_size)))
        ((o * G).sum() / W).backward()
        want = [p.grad.clone() for p in pw.parameters()]
        pw.zero_grad()
        for name in _plans(W, L, ts):
            for r in range(W):
                torch.testing.assert_close(got[r][name][step][0], o.detach()[r * B:(r + 1) * B], rtol=1e-5,
                                           atol=1e-6, msg=f"[{name}] rank {r} step {step} output")
            for j, g in enumerate(want):
                mean = sum(got[r][name][step][1][j] for r in range(W)) / W
                assert bool(g.abs().sum() > 0)
                torch.testing.assert_close(mean, g, rtol=1e-5, atol=1e-6, msg=f"[{name}] step {step} weights {j}")
    for r in range(W if W > 1 else 0):
        err = got[r]["mismatch"]
        assert err is not None and "weight_table is set on rank(s) [0] and not on the others" in err, err
        err = got[r]["own weights"]
        assert err is not None and "rank 1: the batch has per-id weights of its own" in err, err
