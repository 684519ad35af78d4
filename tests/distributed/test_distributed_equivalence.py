"""Sharded training == single-process training, for every sharding type and a mixed plan.

Each test spawns ONE gloo process group (tests.multiprocess) and runs all its cases in it;
the unsharded reference runs in the pytest process. fp32 cases: losses, final full
weights (gathered from the shards), optimizer state and dense weights within 1e-5
relative. Quantized communication (fp16 / bf16 pooled payloads, forward and backward; the
dense model through tanh, not ReLU): within a tolerance scaled by the coarsest wire format's
unit roundoff u (docs/distributed.md): weights, optimizer state and dense parameters within
5 u of the largest change training made to each tensor, losses within 0.1 u relative.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Optional

import pytest
import torch

from distributed_cases import (ALL_TYPES, Case, dense, global_batches, initial_states, initial_tables, local_slice,
                               tables, train_reference, train_sharded, with_bad_ids)
from neo.config.embedding import OptimizerConfig
from neo.distributed import CommConfig, ProcessGroups, ShardedEmbeddingCollection
from tests.multiprocess import run_multiprocess

RTOL, ATOL = 1e-5, 1e-6
# Adagrad's state starts at 0.1, not 0: from zero, the first step divides a row's gradient
# sum by its own magnitude, so where that sum nearly cancels, the 1-ulp differences between
# sharded and unsharded dense gradients (GEMMs at batch B against W B) grow past any fixed
# tolerance: one element of 960 was off by 2.6e-4 relative in a W 4 table-wise adagrad case
# (14.8 times the tolerance), with nothing wrong. From 0.1 its worst element used 0.3% of the
# tolerance, and the mixed adagrad case over four seeds at most 0.2% (25% from 0). Adagrad
# from a zero state is checked against torch.optim in the single-process oracle
# (tests/embedding/test_reference_oracle.py).
ACC0 = 0.1

# Unit roundoff of a wire format (half its machine epsilon): fp16 2^-11, bf16 2^-8.
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def _quantized_tolerance(comm: CommConfig) -> dict:
    """_check's bounds for 16-bit payloads, from the coarsest format's unit roundoff u.

    Each payload element is within u (relative) of its fp32 value, and through a smooth model
    (tanh: _quantized_case) the training's error stays proportional to u and to the updates:
    every weight, optimizer state and dense parameter within 5 u of the largest change the
    reference's training made to its tensor (max |final - initial|), every loss within 0.1 u
    relative. Measured (3 steps, mixed plans, 2026-12-02; seed shifts 0, 7, 1234, 99991 and
    271828 times case seeds 0-3, 20 runs per configuration: W 1 and W 2 fp16, W 2 bf16 forward
    and fp16 backward, W 4 bf16): at most 1.42 u of the change on weights, 2.17 u on
    optimizer state, 0.95 u on dense parameters, 0.018 u on losses. A missed or doubled
    update is off by the whole change, 1 / u = 256 (bf16) to 2048 (fp16) such u: it fails."""
    u = max(UNIT_ROUNDOFF[comm.forward.value], UNIT_ROUNDOFF[comm.backward.value])
    return dict(of_change=5 * u, loss_rtol=0.1 * u)


def _mixed_types(ts) -> dict:
    return {t.name: ALL_TYPES[i % len(ALL_TYPES)] for i, t in enumerate(ts)}


def _quantized_case(name: str, ts, W: int, L: int, forward: str, backward: str, **kw) -> Case:
    """A mixed plan with 16-bit payloads, its dense model through tanh: the payloads move the
    MLP's inputs by up to u relative, and a ReLU whose input lies that close to 0 flips, so
    its sample's gradient changes by O(1), not O(u). With ReLU, 3 of 12 seeds (seed shifts
    0, 7 and 271828, case seeds 0-3, bf16 forward, fp16 backward) moved a weight by 0.42-0.88 u
    (35-97 u of the largest update); through tanh the worst was 0.003 u."""
    return Case(name, ts, _mixed_types(ts), W, L, comm=CommConfig(forward=forward, backward=backward),
                activation="tanh", **kw)


def _check(case: Case, got: dict, rtol: float = RTOL, atol: float = ATOL, loss_rtol: float = RTOL,
           states: bool = True, of_change: Optional[float] = None) -> None:
    """Sharded results ``got`` against the unsharded reference's: within rtol / atol, or, with
    ``of_change``, each tensor within that fraction of the largest change the reference's
    training made to it (losses: loss_rtol relative)."""
    ref = train_reference(case)
    msg = lambda what: (lambda m: f"[{case.name}] {what}: {m}")  # noqa: E731

    def close(a: torch.Tensor, b: torch.Tensor, b0: torch.Tensor, what: str) -> None:
        if of_change is None:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=msg(what))
        else:
            bound = of_change * float((b - b0).abs().max())
            torch.testing.assert_close(a, b, rtol=0.0, atol=bound, msg=msg(what))

    initial = initial_tables(case)
    for name, w in initial.items():       # the plan does not change the initial tables
        assert torch.equal(got["initial"][name], w.to(torch.float32)), f"[{case.name}] table {name} starts elsewhere"
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=loss_rtol,
                               atol=atol if of_change is None else 0.0, msg=msg("losses"))
    for name, w in ref["weights"].items():
        close(got["weights"][name], w, initial[name], f"table {name} weights")
    if states:
        initial_st = initial_states(case)
        for name, st in ref["states"].items():
            for k, v in st.items():
                close(got["states"][name][k], v, initial_st[name][k], f"table {name} optimizer state {k}")
    for i, (a, b, b0) in enumerate(zip(got["dense"], ref["dense"], dense(case).parameters())):
        close(a, b, b0.detach(), f"dense parameter {i}")
    assert got["drift"] == 0.0, f"[{case.name}] data-parallel replicas differ by {got['drift']}"


def _cases(W: int, L: int) -> list:
    sgd = tables(3)
    cases = [Case(f"W{W} {st} sgd", sgd, {t.name: st for t in sgd}, W, L) for st in ALL_TYPES]
    ada = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(1, 2, 3, 4))
    cases.append(Case(f"W{W} mixed adagrad mean weighted", ada, _mixed_types(ada), W, L, weighted=True))
    # every rank the same columns (3 tables, 4 features, D 16): the pooled AlltoAlls run in place
    even = tables(3 * W, OptimizerConfig("sgd", lr=0.5), mean=(1,), dims=[16])
    cases.append(Case(f"W{W} table_wise sgd, equal columns per rank", even, {t.name: "table_wise" for t in even}, W, L))
    adam = tables(6, OptimizerConfig("adam", lr=0.05), mean=(0, 5))
    cases.append(Case(f"W{W} mixed adam via parallelize()", adam, _mixed_types(adam), W, L, use_parallelize=True))
    return cases


def _run_and_check(cases, W, L_for_spawn):
    results = run_multiprocess(train_sharded, W, cases, local_world_size=L_for_spawn, timeout_s=240)
    for r, per_rank in enumerate(results[1:], 1):          # every rank gathered the same tables
        for a, b in zip(per_rank, results[0]):
            assert a["losses"] == b["losses"], f"rank {r} sees other losses"
    return results[0]


def test_world_size_1_one_rank_path():
    """At world size 1 the output is assembled straight from the lookup's (ShardedEmbeddingCollection's
    one-rank path): every sharding type, and mixes (column shards side by side on the one rank), train
    as the unsharded reference does, and bit for bit as the general path (every type's output
    distribution run as at W > 1, forced on the same cases) does; quantized wire precision keeps the
    general path, and so does a mean-pooled row-wise table (its output distribution divides by the
    bag lengths)."""
    cases = [replace(c, shm=False) for c in _cases(1, 1)]                  # one rank: no shared memory
    sum_mixed = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0))
    cases.append(Case("W1 mixed adagrad sum weighted", sum_mixed, _mixed_types(sum_mixed), 1, 1, weighted=True,
                      shm=False))
    general = [replace(c, name=c.name + " (general path)", general_path=True) for c in cases]
    mixed = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(2, 4))
    fp16 = [_quantized_case("W1 mixed fp16 comm", mixed, 1, 1, "fp16", "fp16", shm=False)]
    got = _run_and_check(cases + general + fp16, 1, 1)
    for case, g in zip(cases, got):
        _check(case, g)
    for case, fast, slow in zip(cases, got, got[len(cases):]):
        assert fast["losses"] == slow["losses"], case.name
        for name, w in slow["weights"].items():
            assert torch.equal(fast["weights"][name], w), f"[{case.name}] table {name}"
    _check(fp16[0], got[-1], **_quantized_tolerance(fp16[0].comm))


def test_world_size_2():
    W = 2
    cases = _cases(W, 2)
    rw = tables(3, OptimizerConfig("rowwise_adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(0,))
    cases.append(Case("W2 row_wise + table_row_wise rowwise_adagrad mean", rw,
                      {"t0": "row_wise", "t1": "table_row_wise", "t2": "row_wise"}, W, 2))
    mixed = tables(6, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0), mean=(2, 4))
    cases.append(Case("W2 mixed, two nodes of one rank", mixed, _mixed_types(mixed), W, 1, weighted=True))
    cases.append(_quantized_case("W2 mixed fp16 comm", mixed, W, 2, "fp16", "fp16"))
    cases.append(_quantized_case("W2 mixed bf16 comm (fwd) fp16 (bwd)", mixed, W, 2, "bf16", "fp16"))
    got = _run_and_check(cases, W, 2)
    for case, g in zip(cases, got):
        if case.comm.forward.value == "fp32" and case.comm.backward.value == "fp32":
            _check(case, g)
        else:
            _check(case, g, **_quantized_tolerance(case.comm))


def test_world_size_4_two_nodes():
    W, L = 4, 2
    cases = _cases(W, L)
    mixed = tables(6, OptimizerConfig("sgd", lr=0.5), mean=(2, 4))
    cases.append(_quantized_case("W4 mixed bf16 comm", mixed, W, L, "bf16", "bf16"))
    got = _run_and_check(cases, W, L)
    for case, g in zip(cases, got):
        if case.comm.forward.value == "fp32":
            _check(case, g)
        else:
            _check(case, g, **_quantized_tolerance(case.comm))


def test_shared_memory_and_gloo_transports_agree_bitwise():
    """Every sharding type at once, two nodes of two ranks (intra and cross groups, AlltoAll,
    ReduceScatter as AlltoAll, AllGather): the transports move the same bytes."""
    W, L = 4, 2
    ts = tables(6, OptimizerConfig("adagrad", lr=0.3), mean=(1, 4))
    cases = [Case(f"W4 mixed shm={shm}", ts, _mixed_types(ts), W, L, weighted=True, shm=shm) for shm in (True, False)]
    shm, gloo = _run_and_check(cases, W, L)
    assert shm["losses"] == gloo["losses"]
    for part in ("weights", "states"):
        for name in shm[part]:
            a, b = shm[part][name], gloo[part][name]
            if isinstance(a, dict):
                for k in a:
                    assert torch.equal(a[k], b[k]), f"{part} {name} {k}"
            else:
                assert torch.equal(a, b), f"{part} {name}"
    assert all(torch.equal(a, b) for a, b in zip(shm["dense"], gloo["dense"]))


def test_quantized_comm_is_not_exact():
    """Sanity check of the tolerance test: 16-bit payloads do change the result."""
    W = 2
    mixed = tables(6, OptimizerConfig("sgd", lr=0.5))
    case = replace(_quantized_case("W2 fp16", mixed, W, 2, "fp16", "fp16"),
                   types={t.name: "table_wise" for t in mixed})
    got = run_multiprocess(train_sharded, W, [case])[0][0]
    ref = train_reference(case)
    assert any(not torch.equal(got["weights"][n], w) for n, w in ref["weights"].items())
    _check(case, got, **_quantized_tolerance(case.comm))


@pytest.mark.parametrize("shm", [True, False])
def test_bad_input_raises_on_every_rank(shm):
    """An id out of range, or a batch one sample short, on rank 1 only: every rank raises, naming
    it, before any collective whose sizes depend on it (a batch size mismatch used to abort the
    process under gloo, and to leave shared memory unusable), and the group still trains."""
    W, ts = 2, tables(6)
    cases = [Case("bad input", ts, _mixed_types(ts), W, 2, bad_id_rank=1, shm=shm),
             Case("short batch", ts, _mixed_types(ts), W, 2, short_batch_rank=1, shm=shm),
             Case("missing feature", ts, _mixed_types(ts), W, 2, missing_feature_rank=1, shm=shm),
             Case("missing feature, ids unchecked", ts, _mixed_types(ts), W, 2, missing_feature_rank=1, shm=shm,
                  validate=False),
             Case("after bad input the group still works", ts, _mixed_types(ts), W, 2, shm=shm)]
    # the same at the second step, after a batch has gone through
    later = [replace(c, name=c.name + " (step 1)", bad_step=1) for c in cases[:3]]
    got = run_multiprocess(train_sharded, W, cases + later, local_world_size=2, collective_timeout_s=20)
    for rank, res in enumerate(got):
        for first in (0, 5):
            err = res[first]["error"]
            assert err is not None, f"rank {rank} did not raise"
            assert "rank 1" in err and "id 10000" in err and "out of range" in err and "table 't" in err, err
            err = res[first + 1]["error"]
            assert err is not None and "every rank must pass the same batch size; got [6, 5] per rank" in err, err
            for k in (first + 2, 3) if first == 0 else (first + 2,):   # before, rank 0 waited in the header
                err = res[k]["error"]                                      # exchange (audit of 2026-11-30)
                assert err is not None and "bad input on" in err and \
                    "rank 1: feature 'f0a' (table 't0') not in its batch" in err, (k, err)
        assert [len(res[k]["losses"]) for k in (5, 6, 7)] == [1, 1, 1]     # step 0 trained, step 1 raised
    _check(cases[4], got[0][4])


def test_learnable_weights_raise_on_every_rank():
    """Per-id weights that require grad on rank 1 only (ids checked, or not): their gradient would
    come back in a collective rank 0 does not join, so every rank raises, naming rank 1 and the
    cause, instead of hanging; the group then trains a weighted case as before. (Where every rank's
    weights require grad they train: test_sharded_weight_grad.py.)"""
    W, ts = 2, tables(6)
    cases = [Case("learnable weights", ts, _mixed_types(ts), W, 2, weighted=True, learnable_weights_rank=1),
             Case("learnable weights, ids unchecked", ts, _mixed_types(ts), W, 2, weighted=True,
                  learnable_weights_rank=1, validate=False),
             Case("learnable weights at step 1", ts, _mixed_types(ts), W, 2, weighted=True,
                  learnable_weights_rank=1, bad_step=1),
             Case("after them the group still trains", ts, _mixed_types(ts), W, 2, weighted=True)]
    got = run_multiprocess(train_sharded, W, cases, local_world_size=2, collective_timeout_s=20)
    for rank, res in enumerate(got):
        for k in range(3):
            err = res[k]["error"]
            assert err is not None, f"rank {rank} did not raise in case {k}"
            assert "the per-id weights require grad on rank(s) [1] and not on the others" in err, (k, err)
        assert [len(res[k]["losses"]) for k in range(3)] == [0, 0, 1]
    _check(cases[3], got[0][3])


def _skip_case(sharding_type: str, world_size: int = 2) -> Case:
    ts = tables(3, OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=ACC0))
    return Case(f"skips {sharding_type}", ts, {t.name: sharding_type for t in ts}, world_size, 2, steps=2)


def _absmax(x: torch.Tensor) -> float:
    return float(x.detach().abs().max()) if x.numel() else 0.0


def _skip_counts(rank: int, world_size: int):
    """validate=False under every sharding type (one node of two ranks): each rank's batches hold
    ids outside their tables (below, at and past the end), through a pooled step and an unpooled
    (sequence) step; the same collection with validation on trains on the same batches with those
    ids removed. validate=True: nothing is skipped and nothing is counted, and the local lookup
    (its ids checked or counted upstream) refuses to report a count of its own."""
    pg = ProcessGroups.build(2, timeout=datetime.timedelta(seconds=30))
    out = {}
    for st in ALL_TYPES:
        case = _skip_case(st, world_size)
        ts = case.tables
        loose = ShardedEmbeddingCollection(ts, case.plan(), pg, backend="auto", validate=False)
        checked = ShardedEmbeddingCollection(ts, case.plan(), pg, backend="auto")
        for sec in (loose, checked):
            sec.load_full_weights(initial_tables(case))
        rows = {f: t.num_rows for t in ts for f in t.feature_names}
        sent = {t.name: 0 for t in ts}
        gen = torch.Generator().manual_seed(7)
        worst = 0.0                                     # largest |loose - checked| of the looked-up rows
        for step, batch in enumerate(global_batches(case)):
            bad, clean, n = with_bad_ids(local_slice(batch, rank, case.batch_size), ts, every=4, start=rank + step)
            sent = {k: sent[k] + n[k] for k in sent}
            if step == 0:                               # pooled: (B, sum D), invalid ids add nothing
                got, want = loose(bad), checked(clean)
                coef = torch.randn(want.shape, generator=gen)
                worst = max(worst, _absmax(got - want))
                for y in (got, want):
                    (y * coef).sum().backward()
            else:                                       # unpooled: invalid ids are zero rows
                got, want = loose.sequence(bad), checked.sequence(clean)
                for f in bad.keys:
                    ids = bad.feature(f)[0]
                    valid = (ids >= 0) & (ids < rows[f])
                    worst = max(worst, _absmax(got[f].values[valid] - want[f].values), _absmax(got[f].values[~valid]))
                for y in (got, want):
                    sum((s.values ** 2).sum() for s in y.values()).backward()
        lookup_counts = []
        for sec in (loose, checked):
            try:
                lookup_counts.append(sec.lookup.skipped_ids if sec.lookup is not None else None)
            except RuntimeError:
                lookup_counts.append("raises")
        out[st] = {"counts": loose.skipped_ids, "checked_counts": checked.skipped_ids, "sent": sent,
                   "lookup_counts": lookup_counts, "worst": worst,
                   "weights": (loose.full_weights(), checked.full_weights()),
                   "states": (loose.full_optimizer_state(), checked.full_optimizer_state())}
    return out


def test_skipped_ids_are_counted_once_at_the_source_under_every_sharding():
    """Every sharding type at W 2: each invalid id counted once, by the rank whose batch held it
    (per table, keyed by the table's name: a column-split table's ids reach every column shard,
    a data-parallel table's every replica, a row-split table's invalid ids no shard), pooled and
    unpooled; the sums over the ranks equal the ids sent; and the invalid ids train as if they
    had been removed from the batches."""
    got = run_multiprocess(_skip_counts, 2, timeout_s=240)
    for st in ALL_TYPES:
        per_rank = [res[st] for res in got]
        for rank, res in enumerate(per_rank):
            assert res["counts"] == res["sent"], (st, rank, res["counts"], res["sent"])
            assert set(res["checked_counts"].values()) == {0}, (st, rank, res["checked_counts"])
            assert res["lookup_counts"] == ["raises", "raises"], (st, rank, res["lookup_counts"])
            assert res["worst"] <= ATOL, (st, rank, res["worst"])
        total = {t: sum(res["counts"][t] for res in per_rank) for t in per_rank[0]["counts"]}
        assert total == {t: sum(res["sent"][t] for res in per_rank) for t in total}, (st, total)
        assert all(n > 0 for n in total.values()), (st, total)       # every table saw invalid ids
        (loose_w, checked_w), (loose_s, checked_s) = per_rank[0]["weights"], per_rank[0]["states"]
        for name, w in checked_w.items():
            torch.testing.assert_close(loose_w[name], w, rtol=RTOL, atol=ATOL, msg=lambda m: f"[{st}] {name}: {m}")
            for k, v in checked_s[name].items():
                torch.testing.assert_close(loose_s[name][k], v, rtol=RTOL, atol=ATOL,
                                           msg=lambda m: f"[{st}] {name} {k}: {m}")
        start = initial_tables(_skip_case(st))
        assert any(not torch.equal(w, start[n]) for n, w in checked_w.items()), f"[{st}] nothing trained"
