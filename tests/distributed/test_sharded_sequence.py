"""Sharded unpooled lookups (ShardedEmbeddingCollection.sequence) == the unsharded module's.

Oracle: one TableBatchedEmbedding (reference backend) over the global batch (rank r's samples
r*B .. (r+1)*B-1), trained with the loss (1 / W) sum_r loss_r, where loss_r is what rank r
computes from its own rows: the contract of ``average_gradients`` (module doc of
neo.distributed.sequence). Every step's rows, and the tables and optimizer state after three
steps, must agree, for every sharding type (one gloo group per world size, tests.multiprocess).
"""

from __future__ import annotations

import datetime
import zlib
from typing import Dict, List

import pytest
import torch

from distributed_cases import ALL_TYPES, Case, global_batches, initial_tables, local_slice, tables
from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import CommConfig, ProcessGroups, ShardedEmbeddingCollection
from neo.embedding import TableBatchedEmbedding
from neo.embedding.checks import EmbeddingInputError
from tests.multiprocess import run_multiprocess

RTOL, ATOL = 1e-5, 1e-6


def _targets(case: Case, step: int, rank: int, feature: str, n: int, dim: int) -> torch.Tensor:
    """Rank ``rank``'s fixed random weights for a feature's rows (its loss_r)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.seed} {step} {rank} {feature}".encode()))
    return torch.randn(n, dim, generator=gen)


def _loss(rows: Dict[str, torch.Tensor], targets: Dict[str, torch.Tensor]) -> torch.Tensor:
    """A loss whose gradient depends on the rows (their squares) and on the targets."""
    return sum((v * targets[f]).sum() + 0.25 * (v * v).sum() for f, v in rows.items())


def _reference(case: Case) -> Dict:
    W, B = case.world_size, case.batch_size
    emb = TableBatchedEmbedding(case.tables, backend="reference", seed=case.seed)
    out = []
    for step, batch in enumerate(global_batches(case)):
        seq = emb.sequence(batch)
        per_rank = [{f: s.values[s.offsets[r * B]:s.offsets[(r + 1) * B]] for f, s in seq.items()} for r in range(W)]
        loss = sum(_loss(rows, {f: _targets(case, step, r, f, *v.shape) for f, v in rows.items()})
                   for r, rows in enumerate(per_rank)) / W
        loss.backward()
        out.append([{f: v.detach().clone() for f, v in rows.items()} for rows in per_rank])
    weights = {t.name: emb.table_weight(t.name).detach().clone() for t in case.tables}
    states = {t.name: {k: v.clone() for k, v in emb.table_optimizer_state(t.name).items()} for t in case.tables}
    return {"rows": out, "weights": weights, "states": states}


class _NoSlots:
    """A weight_table an unpooled lookup must leave alone: its ids travel without slots."""

    def table_index(self, batch):
        raise AssertionError("an unpooled lookup asked the weight_table for slots")

    def read(self, slots):
        raise AssertionError("an unpooled lookup read the weight_table")


def _sharded(rank: int, world_size: int, cases: List[Case]) -> List[Dict]:
    pg = ProcessGroups.build(cases[0].local_world_size, timeout=datetime.timedelta(seconds=60))
    results = []
    for case in cases:
        sec = ShardedEmbeddingCollection(case.tables, case.plan(), pg, backend="auto", seed=case.seed, comm=case.comm)
        sec.weight_table = _NoSlots()          # a pooled lookup's position weights: unpooled ones take none
        sec.load_full_weights(initial_tables(case))
        rows_per_step = []
        for step, batch in enumerate(global_batches(case)):
            local = local_slice(batch, rank, case.batch_size)
            seq = sec.sequence(local)
            assert list(seq) == list(local.keys)
            for f, s in seq.items():
                assert torch.equal(s.lengths, local.feature(f)[1]), f
            rows = {f: s.values for f, s in seq.items()}
            _loss(rows, {f: _targets(case, step, rank, f, *v.shape) for f, v in rows.items()}).backward()
            rows_per_step.append({f: v.detach().clone() for f, v in rows.items()})
        sec.eval()
        with torch.no_grad():                                             # inference: no autograd, same rows
            again = sec.sequence(local_slice(global_batches(case)[0], rank, case.batch_size))
        results.append({"rows": rows_per_step, "weights": sec.full_weights(),
                        "states": sec.full_optimizer_state(), "drift": sec.replica_drift(),
                        "eval_features": sorted(again)})
    return results


def _check(case: Case, got_ranks: List[Dict]) -> None:
    ref = _reference(case)
    quantized = case.comm != CommConfig()
    # 16-bit rows and gradients on the wire: the pooled path's documented tolerance (docs/distributed.md)
    rtol, atol = (2e-2, 1e-2) if quantized else (RTOL, ATOL)
    for rank, got in enumerate(got_ranks):
        for step, (g, r) in enumerate(zip(got["rows"], ref["rows"])):
            for f, v in r[rank].items():
                torch.testing.assert_close(g[f], v, rtol=rtol, atol=atol,
                                           msg=lambda m: f"[{case.name}] rank {rank} step {step} feature {f}: {m}")
        for name, w in ref["weights"].items():
            torch.testing.assert_close(got["weights"][name], w, rtol=rtol, atol=atol,
                                       msg=lambda m: f"[{case.name}] table {name}: {m}")
        for name, st in ref["states"].items():
            for k, v in st.items():
                torch.testing.assert_close(got["states"][name][k], v, rtol=rtol, atol=atol,
                                           msg=lambda m: f"[{case.name}] table {name} state {k}: {m}")
        assert got["drift"] == 0.0, f"[{case.name}] data-parallel replicas differ by {got['drift']}"
        assert got["eval_features"] == sorted(f for t in case.tables for f in t.feature_names)


def _cases(W: int, L: int) -> List[Case]:
    ada = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=0.1))
    cases = [Case(f"W{W} {st} adagrad", ada, {t.name: st for t in ada}, W, L) for st in ALL_TYPES]
    adam = tables(6, OptimizerConfig("adam", lr=0.05))
    cases.append(Case(f"W{W} mixed adam", adam, {t.name: ALL_TYPES[i % 6] for i, t in enumerate(adam)}, W, L, seed=3))
    # row-wise state is exact except on column-split tables (docs/distributed.md), as pooled
    rw = tables(3, OptimizerConfig("rowwise_adagrad", lr=0.3, initial_accumulator_value=0.1))
    types = ("row_wise", "table_row_wise", "data_parallel")
    cases.append(Case(f"W{W} row-split + dp rowwise_adagrad", rw, {t.name: types[i] for i, t in enumerate(rw)},
                      W, L, seed=5))
    # cached shards (caches of 200 of 400 rows a table, scaled to each shard): the lookup prefetches
    cached = [TableConfig(f"c{i}", num_rows=400, dim=8, feature_names=(f"c{i}",), placement="cached", cache_rows=200,
                          cache_store="host", optimizer=OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=0.1))
              for i in range(3)]
    cases.append(Case(f"W{W} cached table/row/column-wise", cached,
                      {"c0": "table_wise", "c1": "row_wise", "c2": "column_wise"}, W, L, seed=7))
    if W == 2:
        # 16-bit gradients with adagrad from 0.1, not adam: adam's first step is lr * g / (|g| + eps),
        # about lr * sign(g), so where a row's gradient pieces nearly cancel, their rounding on the
        # wire moves that element by up to lr (seen: 0.05 against the 1e-2 allowed) with nothing wrong
        cases.append(Case("W2 mixed adagrad fp16 comm", ada, {t.name: ALL_TYPES[i % 6] for i, t in enumerate(ada)},
                          W, L, seed=3, comm=CommConfig(forward="fp16", backward="bf16")))
    return cases


@pytest.mark.parametrize("W,L", [(2, 2), (4, 2)])
def test_sharded_sequence_equals_unsharded(W, L):
    cases = _cases(W, L)
    got = run_multiprocess(_sharded, W, cases, timeout_s=240)
    for i, case in enumerate(cases):
        _check(case, [got[r][i] for r in range(W)])


def _errors(rank: int, world_size: int) -> List[str]:
    pg = ProcessGroups.build(1, timeout=datetime.timedelta(seconds=30))
    ts = tables(3)
    case = Case("errors", ts, {t.name: "row_wise" for t in ts}, world_size, 1)
    sec = ShardedEmbeddingCollection(ts, case.plan(), pg, backend="auto")
    batch = local_slice(global_batches(case)[0], rank, case.batch_size)
    out = []
    weighted = type(batch)(batch.keys, batch.values, batch.lengths, batch.batch_size,
                           weights=torch.ones(batch.values.numel()))
    for bad in (weighted,):
        try:
            sec.sequence(bad)
        except EmbeddingInputError as e:
            out.append(str(e))
    good = batch.values.clone()
    if rank == 1:
        batch.values[0] = 10_000                                          # out of range on rank 1 only
    try:
        sec.sequence(batch)
    except EmbeddingInputError as e:
        out.append(str(e))
    # validate=False: the bad id comes back as a zero row (row-wise: it went to no shard), the rest as before
    loose = ShardedEmbeddingCollection(ts, case.plan(), pg, backend="auto", validate=False)
    with torch.no_grad():
        bad_rows = loose.sequence(batch)
        good_rows = loose.sequence(type(batch)(batch.keys, good, batch.lengths, batch.batch_size))
    first = next(f for f in batch.keys if batch.feature(f)[0].numel())    # the feature of values[0]
    for f in batch.keys:
        want = good_rows[f].values.clone()
        if rank == 1 and f == first:
            want[0] = 0
        assert torch.equal(bad_rows[f].values, want), (rank, f)
    return out


def test_sharded_sequence_errors_raise_on_every_rank():
    got = run_multiprocess(_errors, 2)
    for rank, msgs in enumerate(got):
        assert len(msgs) == 2, (rank, msgs)
        assert "weights" in msgs[0]
        assert "rank 1" in msgs[1] and "10000" in msgs[1] and "out of range" in msgs[1], msgs[1]


class _SequenceModel(torch.nn.Module):
    """A model over unpooled lookups: each feature's rows weighed by their position in the sample
    (a learned dense parameter), summed per sample, then a linear layer (no distributed code)."""

    def __init__(self, tables, seed: int):
        super().__init__()
        self.embedding = TableBatchedEmbedding(tables, backend="reference", seed=seed)
        torch.manual_seed(seed)
        self.position = torch.nn.Parameter(torch.linspace(1.0, 0.25, 4))
        self.head = torch.nn.Linear(sum(t.dim * len(t.feature_names) for t in tables), 1)

    def forward(self, batch) -> torch.Tensor:
        seq = self.embedding.sequence(batch)
        feats = [(s.to_padded(4) * self.position[None, :, None]).sum(1) for s in seq.values()]   # (B, D) each
        return self.head(torch.cat(feats, dim=1)).squeeze(1)                                        # (B,)


def _train_model(model, batches, labels) -> List[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for batch, y in zip(batches, labels):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _parallelized(rank: int, world_size: int, case: Case) -> Dict:
    from neo.distributed import parallelize          # the function, as users import it

    pg = ProcessGroups.build(case.local_world_size, timeout=datetime.timedelta(seconds=60))
    model = _SequenceModel(case.tables, case.seed)
    sec = ShardedEmbeddingCollection(case.tables, case.plan(), pg, backend="auto", seed=case.seed)
    sec.load_full_weights({t.name: model.embedding.table_weight(t.name) for t in case.tables})
    ddp = parallelize(model, "embedding", sec, pg)
    B = case.batch_size
    gen = torch.Generator().manual_seed(9)
    labels = [torch.randint(0, 2, (B * world_size,), generator=gen).float()[rank * B:(rank + 1) * B] for _ in range(3)]
    batches = [local_slice(b, rank, B) for b in global_batches(case)]
    losses = _train_model(ddp, batches, labels)
    return {"losses": losses, "weights": sec.full_weights(), "dense": {k: v.detach().clone() for k, v in
                                                                         model.named_parameters() if "embedding" not in k}}


def test_a_model_over_sequences_trains_the_same_parallelized():
    """parallelize(model, "embedding", sharded, pg) on a model that calls embedding.sequence:
    mean losses, tables and dense parameters equal single-process training on the global batch."""
    ts = tables(4, OptimizerConfig("adagrad", lr=0.2, initial_accumulator_value=0.1))
    case = Case("parallelized sequence model", ts, {t.name: ALL_TYPES[i % 6] for i, t in enumerate(ts)}, 2, 2, seed=4)
    got = run_multiprocess(_parallelized, 2, case)
    ref = _SequenceModel(case.tables, case.seed)
    gen = torch.Generator().manual_seed(9)
    labels = [torch.randint(0, 2, (case.batch_size * 2,), generator=gen).float() for _ in range(3)]
    ref_losses = _train_model(ref, global_batches(case), labels)
    mean_losses = [(a + b) / 2 for a, b in zip(got[0]["losses"], got[1]["losses"])]
    torch.testing.assert_close(torch.tensor(mean_losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for t in case.tables:
        torch.testing.assert_close(got[0]["weights"][t.name], ref.embedding.table_weight(t.name), rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"table {t.name}: {m}")
    for k, v in ref.named_parameters():
        if "embedding" not in k:
            for r in range(2):
                torch.testing.assert_close(got[r]["dense"][k], v.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")
