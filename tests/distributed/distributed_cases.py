"""Training cases shared by the distributed tests: the same model trained sharded and unsharded.

Model: pooled embeddings (B, sum D) -> Linear(D, 8) -> ReLU -> Linear(8, 1), BCE-with-logits
loss. The global batch is the concatenation of every rank's local batch (rank r holds
samples r*B .. (r+1)*B-1). Unsharded: one TableBatchedEmbedding over the global batch,
loss = mean over the W*B samples. Sharded: each rank's loss = mean over its B samples,
DDP averages dense gradients, the collection divides embedding gradients by W.
"""

from __future__ import annotations

import bisect
import datetime
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import CommConfig, ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.embedding import PositionWeights, TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch

ALL_TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise")


@dataclass
class Case:
    name: str
    tables: List[TableConfig]
    types: Dict[str, str]
    world_size: int
    local_world_size: int
    batch_size: int = 6
    steps: int = 3
    weighted: bool = False
    comm: CommConfig = field(default_factory=CommConfig)
    seed: int = 0
    dense_lr: float = 0.1
    bad_id_rank: Optional[int] = None
    """Put an out-of-range id into this rank's first batch (expects every rank to raise)."""
    short_batch_rank: Optional[int] = None
    """This rank's first batch one sample short (expects every rank to raise)."""
    missing_feature_rank: Optional[int] = None
    """This rank's first batch without its first feature (expects every rank to raise)."""
    learnable_weights_rank: Optional[int] = None
    """This rank's first batch with per-id weights that require grad, the other ranks' not
    (weighted cases; expects every rank to raise: they must agree)."""
    learnable_weights: bool = False
    """Per-id weights by position in the bag, learned (:class:`neo.embedding.PositionWeights`
    before the lookup, trained with the dense model: its parameters are the results' last ``dense``)."""
    bad_step: int = 0
    """The step whose batch the four above spoil (0: before any batch has been distributed)."""
    validate: bool = True
    """ShardedEmbeddingCollection(validate=...): ids checked at the source, or counted."""
    use_parallelize: bool = False
    """Build the model unsharded, then neo.distributed.parallelize it (instead of DDP by hand)."""
    shm: bool = True
    """AlltoAlls and AllGathers through shared memory (False: through gloo)."""
    general_path: bool = False
    """At world size 1: the input and every type's output distribution run as at W > 1 (not the
    one-rank paths)."""
    activation: str = "relu"
    """The dense model's activation, "relu" or "tanh" (smooth: the cases with 16-bit payloads,
    whose results are compared within a tolerance; see test_distributed_equivalence)."""

    def plan(self) -> Dict[str, Any]:
        return even_plan(self.tables, self.types, self.world_size, self.local_world_size)


def tables(n: int = 6, optimizer: OptimizerConfig = OptimizerConfig("sgd", lr=0.5), mean=(), dims=None) -> List[TableConfig]:
    """n small tables, rows 20..45, dims cycling 8, 16, 12 (12 splits unevenly into column shards)."""
    dims = dims or [8, 16, 12]
    out = []
    for i in range(n):
        feats = (f"f{i}a", f"f{i}b") if i % 3 == 0 else (f"f{i}",)
        out.append(TableConfig(f"t{i}", num_rows=20 + 5 * i, dim=dims[i % len(dims)], feature_names=feats,
                               pooling="mean" if i in mean else "sum", optimizer=optimizer))
    return out


def global_batches(case: Case) -> List[KeyedJaggedBatch]:
    gen = torch.Generator().manual_seed(1000 + case.seed)
    GB = case.batch_size * case.world_size
    out = []
    for _ in range(case.steps):
        keys, values, lengths = [], [], []
        for t in case.tables:
            for f in t.feature_names:
                lens = torch.randint(0, 5, (GB,), generator=gen)
                ids = torch.randint(0, t.num_rows, (int(lens.sum()),), generator=gen)
                hot = torch.rand(ids.numel(), generator=gen) < 0.3
                ids[hot] = torch.randint(0, 3, (int(hot.sum()),), generator=gen)        # repeated rows
                keys.append(f)
                values.append(ids)
                lengths.append(lens)
        v = torch.cat(values)
        w = torch.rand(v.numel(), generator=gen) + 0.5 if case.weighted else None
        out.append(KeyedJaggedBatch(tuple(keys), v, torch.cat(lengths), GB, weights=w))
    return out


def labels(case: Case) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(2000 + case.seed)
    return [torch.randint(0, 2, (case.batch_size * case.world_size,), generator=gen).float() for _ in range(case.steps)]


def local_slice(batch: KeyedJaggedBatch, rank: int, B: int) -> KeyedJaggedBatch:
    """Samples rank*B .. (rank+1)*B-1 of a global batch."""
    GB = batch.batch_size
    vals, lens, ws = [], [], []
    for f in range(len(batch.keys)):
        lo, hi = f * GB + rank * B, f * GB + (rank + 1) * B
        a, b = int(batch.offsets[lo]), int(batch.offsets[hi])
        vals.append(batch.values[a:b])
        lens.append(batch.lengths[lo:hi])
        if batch.weights is not None:
            ws.append(batch.weights[a:b])
    return KeyedJaggedBatch(batch.keys, torch.cat(vals), torch.cat(lens), B,
                            weights=torch.cat(ws) if ws else None)


def with_bad_ids(batch: KeyedJaggedBatch, case_tables: List[TableConfig], every: int,
                 start: int = 0) -> Tuple[KeyedJaggedBatch, KeyedJaggedBatch, Dict[str, int]]:
    """(bad, clean, sent): ``batch`` with every ``every``-th id from ``start`` replaced by one
    outside its table (cycling through -1, rows, 10000, -(rows + 2), rows + 1: below, at and
    past the end), the same batch with those ids removed instead, and the ids replaced per table."""
    B, F = batch.batch_size, len(batch.keys)
    table_of = {f: t for t in case_tables for f in t.feature_names}
    starts = batch.offsets[::B].tolist() if B else [0] * (F + 1)                        # (F + 1,)
    values = batch.values.clone()
    keep = torch.ones(values.numel(), dtype=torch.bool)
    sent = {t.name: 0 for t in case_tables}
    for n, pos in enumerate(range(start, values.numel(), every)):
        t = table_of[batch.keys[bisect.bisect_right(starts, pos) - 1]]
        values[pos] = (-1, t.num_rows, 10_000, -(t.num_rows + 2), t.num_rows + 1)[n % 5]
        keep[pos] = False
        sent[t.name] += 1
    kept = torch.zeros(values.numel() + 1, dtype=torch.int64)
    torch.cumsum(keep, 0, out=kept[1:])
    lengths = kept[batch.offsets[1:]] - kept[batch.offsets[:-1]]                        # (F * B,)
    bad = KeyedJaggedBatch(batch.keys, values, batch.lengths, B)
    clean = KeyedJaggedBatch(batch.keys, batch.values[keep], lengths, B)
    return bad, clean, sent


def dense(case: Case) -> nn.Module:
    torch.manual_seed(3000 + case.seed)
    D = sum(t.dim * len(t.feature_names) for t in case.tables)
    act = {"relu": nn.ReLU, "tanh": nn.Tanh}[case.activation]()
    return nn.Sequential(nn.Linear(D, 8), act, nn.Linear(8, 1))


def position_weights(case: Case) -> PositionWeights:
    """Learnable position weights of every feature (bags of up to 4 ids: :func:`global_batches`),
    started off 1 so that each position's weight differs."""
    pw = PositionWeights({f: 4 for t in case.tables for f in t.feature_names})
    with torch.no_grad():
        for k, p in enumerate(pw.parameters()):
            p.copy_(torch.linspace(0.6, 1.4, 4) + 0.05 * k)
    return pw


def initial_tables(case: Case) -> Dict[str, torch.Tensor]:
    emb = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
    return {t.name: emb.table_weight(t.name).detach().clone() for t in case.tables}


def initial_states(case: Case) -> Dict[str, Dict[str, torch.Tensor]]:
    emb = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
    return {t.name: {k: v.clone() for k, v in emb.table_optimizer_state(t.name).items()} for t in case.tables}


def train_unsharded(model: Callable[[KeyedJaggedBatch], torch.Tensor], emb: TableBatchedEmbedding,
                    dense_params: Iterable[torch.Tensor], opt: torch.optim.Optimizer, case: Case) -> Dict[str, Any]:
    """Single-process training of ``model`` (logits (B, 1); its tables ``emb``) on the global
    batches with ``opt``: the oracle the sharded runs are compared with. Losses per step, then
    the tables, their optimizer state and ``dense_params``, as they end."""
    losses = []
    for batch, y in zip(global_batches(case), labels(case)):
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    states = {t.name: {k: v.clone() for k, v in emb.table_optimizer_state(t.name).items()} for t in case.tables}
    return {"losses": losses, "weights": {t.name: emb.table_weight(t.name).detach().clone() for t in case.tables},
            "states": states, "dense": [p.detach().clone() for p in dense_params]}


def train_reference(case: Case) -> Dict[str, Any]:
    """Single-process training on the global batches."""
    emb = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
    mlp = dense(case)
    if case.learnable_weights:
        pw = position_weights(case)
        params = [*mlp.parameters(), *pw.parameters()]
        opt = torch.optim.SGD(params, lr=case.dense_lr)
        return train_unsharded(lambda b: mlp(emb(pw(b))), emb, params, opt, case)
    opt = torch.optim.SGD(mlp.parameters(), lr=case.dense_lr)
    return train_unsharded(lambda b: mlp(emb(b)), emb, mlp.parameters(), opt, case)


class ToyModel(nn.Module):
    """Embedding + MLP, no distributed code (what parallelize receives)."""

    def __init__(self, case: Case):
        super().__init__()
        self.embedding = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
        self.mlp = dense(case)

    def forward(self, batch: KeyedJaggedBatch) -> torch.Tensor:
        return self.mlp(self.embedding(batch))


def _train_sharded_case(rank: int, case: Case, pg: ProcessGroups) -> Dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from neo.distributed.parallelize import parallelize

    W, B = case.world_size, case.batch_size
    sec = ShardedEmbeddingCollection(case.tables, case.plan(), pg, backend="auto", comm=case.comm, seed=case.seed,
                                     validate=case.validate)
    initial = sec.full_weights()
    mean_row_wise = any(t.pooling.value == "mean" and case.types[t.name] in ("row_wise", "table_row_wise")
                        for t in case.tables)
    assert sec._one_rank == (W == 1 and case.comm == CommConfig() and not mean_row_wise), case.name
    assert sec._input_dist.one_rank == (W == 1), case.name          # every slot holds its table's every row
    if case.general_path:
        sec._one_rank = False
        sec._input_dist.one_rank = False
    if case.use_parallelize:
        toy = ToyModel(case)
        sec.load_full_weights({t.name: toy.embedding.table_weight(t.name) for t in case.tables})
        model = parallelize(toy, "embedding", sec, pg)
        mlp, step_fn = toy.mlp, model
        opt = torch.optim.SGD(model.parameters(), lr=case.dense_lr)
    else:                # no weights copied: every shard starts at its rows and columns of the unsharded tables
        ddp = DDP(dense(case), process_group=pg.dense)
        mlp, step_fn = ddp.module, lambda b: ddp(sec(b))
        params = list(ddp.parameters())
        pw_params: list = []
        if case.learnable_weights:
            pw = DDP(position_weights(case), process_group=pg.dense)
            step_fn = lambda b: ddp(sec(pw(b)))  # noqa: E731
            pw_params = list(pw.module.parameters())
            params += pw_params
        opt = torch.optim.SGD(params, lr=case.dense_lr)
    losses, error = [], None
    for step, (batch, y) in enumerate(zip(global_batches(case), labels(case))):
        local = local_slice(batch, rank, B)
        if case.bad_id_rank == rank and step == case.bad_step:
            local.values[-1] = 10_000                                     # out of range on this rank only
        if case.short_batch_rank == rank and step == case.bad_step:
            local = local_slice(local, 0, B - 1)                          # a partial batch on this rank only
        if case.missing_feature_rank == rank and step == case.bad_step:
            local = local.permute(local.keys[1:])                         # its first feature left out
        if case.learnable_weights_rank == rank and step == case.bad_step:
            local.weights = local.weights.detach().requires_grad_()       # learnable weights on this rank only
        try:
            logits = step_fn(local)
        except ValueError as e:
            error = str(e)
            break
        loss = nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), y[rank * B:(rank + 1) * B])
        opt.zero_grad()
        loss.backward()
        opt.step()
        g = loss.detach().clone()
        dist.all_reduce(g, group=pg.world)
        losses.append(float(g) / W)
    dense_params = [*mlp.parameters()] + (pw_params if case.learnable_weights else [])
    return {"losses": losses, "error": error, "initial": initial, "weights": sec.full_weights(), "states": sec.full_optimizer_state(),
            "dense": [p.detach().clone() for p in dense_params], "drift": sec.replica_drift()}


def train_sharded(rank: int, world_size: int, cases: List[Case]) -> List[Dict[str, Any]]:
    """Worker for tests.multiprocess: run every case in this one process group."""
    groups: Dict[tuple, ProcessGroups] = {}
    out = []
    for case in cases:
        assert case.world_size == world_size, case.name
        key = (case.local_world_size, case.shm)
        if key not in groups:
            groups[key] = ProcessGroups.build(key[0], timeout=datetime.timedelta(seconds=60), shm=case.shm)
            assert groups[key].uses_shm == case.shm, f"[{case.name}] shared memory expected: {case.shm}"
        out.append(_train_sharded_case(rank, case, groups[key]))
    return out
