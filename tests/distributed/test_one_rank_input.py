"""The input distribution at world size 1 (InputDist.one_rank: the batch itself, no collective)
against its general path: the same local batch, the same error for a bad id, the same counts of
skipped ids. Training through it is checked against the unsharded reference, bit for bit against
the general path, in test_distributed_equivalence.py::test_world_size_1_one_rank_path."""

from __future__ import annotations

import datetime

import torch

from neo.config.embedding import TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection, even_plan
from neo.distributed.input_dist import DistributedInputError
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

B = 4
TABLES = [TableConfig("a", 10, 8, ("fa",)), TableConfig("b", 12, 8, ("fb", "fc")), TableConfig("c", 9, 8, ("fd",))]
TYPES = {"a": "table_wise", "b": "column_wise", "c": "row_wise"}      # b: two column shards, side by side


def _batch(bad: bool, weighted: bool) -> KeyedJaggedBatch:
    gen = torch.Generator().manual_seed(3)
    keys = ("fd", "fb", "fa", "fc")                      # not the collection's order: permuted first
    lengths = torch.randint(1, 4, (len(keys) * B,), generator=gen)
    ids = torch.randint(0, 9, (int(lengths.sum()),), generator=gen)
    if bad:
        ids[-1] = 12                                      # feature fc (table b, 12 rows): row 12 is out
        ids[0] = -1                                       # feature fd (table c, its first bag): a negative id
    w = torch.rand(ids.shape, generator=gen) if weighted else None
    return KeyedJaggedBatch(keys, ids, lengths, B, weights=w)


def _run(rank: int, world_size: int):
    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    plan = even_plan(TABLES, TYPES, 1, 1)
    out = {}
    for validate in (True, False):
        for bad in (False, True):
            for weighted in (False, True):
                for one_rank in (True, False):
                    sec = ShardedEmbeddingCollection(TABLES, plan, pg, seed=1, validate=validate)
                    assert sec._input_dist.one_rank
                    sec._input_dist.one_rank = one_rank
                    key = (validate, bad, weighted, one_rank)
                    try:
                        db = sec.input_dist(_batch(bad, weighted)).wait()
                    except DistributedInputError as e:
                        out[key] = ("error", str(e))
                        continue
                    loc = db.local
                    out[key] = ("batch", loc.keys, loc.values.to(torch.int64), loc.lengths.to(torch.int64),
                                loc.weights, sec.compute(db).detach(), sec.skipped_ids)
        for one_rank in (True, False):     # per-id weights that require grad: their gradient comes back
            sec = ShardedEmbeddingCollection(TABLES, plan, pg, seed=1, validate=validate)
            sec._input_dist.one_rank = one_rank
            batch = _batch(False, True)
            batch.weights.requires_grad_()
            db = sec.input_dist(batch).wait()
            pooled = sec.compute(db)
            (pooled * torch.linspace(-1.0, 1.0, pooled.numel()).view_as(pooled)).sum().backward()
            out[("learnable", validate, one_rank)] = (db.local.weights.requires_grad, batch.weights.grad)
            with torch.no_grad():          # the same batch where no gradient is recorded: distributed
                out[("learnable, no_grad", validate, one_rank)] = sec.input_dist(batch).wait().local.weights
    return out


def test_one_rank_input_equals_the_general_path():
    (got,) = run_multiprocess(_run, 1)
    for validate in (True, False):
        for bad in (False, True):
            for weighted in (False, True):
                fast, general = got[(validate, bad, weighted, True)], got[(validate, bad, weighted, False)]
                assert fast[0] == general[0] == ("error" if validate and bad else "batch")
                if fast[0] == "error":
                    assert fast[1] == general[1]
                    assert "feature 'fc' (table 'b'): id 12 at sample" in fast[1], fast[1]
                    continue
                keys, values, lengths, weights, pooled, skipped = fast[1:]
                assert keys == general[1] == ("fa#0", "fb#0", "fc#0", "fb#1", "fc#1", "fd#0")
                assert torch.equal(pooled, general[5])
                assert skipped == general[6] == {"a": 0, "b": int(bad), "c": int(bad)}
                if bad:    # the general path drops the row-wise table's bad id (no shard holds it), the
                    continue   # one-rank path leaves it to the lookup, which skips it: the same pooled rows
                for a, b in zip((values, lengths, weights), general[2:5]):
                    assert (a is None and b is None) or torch.equal(a, b)


def test_one_rank_input_weights_that_require_grad():
    """Per-id weights that require grad: both paths hand the lookup weights in the graph, and
    their gradient comes back the same (bit for bit, and not zero); under no_grad they go through
    without one."""
    (got,) = run_multiprocess(_run, 1)
    for validate in (True, False):
        (fast_rg, fast), (general_rg, general) = got[("learnable", validate, True)], got[("learnable", validate, False)]
        assert fast_rg and general_rg
        assert fast is not None and general is not None and bool(fast.abs().sum() > 0)
        assert torch.equal(fast, general), (fast, general)
        a, b = got[("learnable, no_grad", validate, True)], got[("learnable, no_grad", validate, False)]
        assert a is not None and not a.requires_grad and torch.equal(a, b)


def _first_bad_id(values, lengths, rows, B):
    """The oracle: [1, feature, id, sample] of the first id outside its table, scanning features in
    order, then samples, then each bag's ids; None where every id is in range."""
    pos = 0
    for f, r in enumerate(rows):
        for b in range(B):
            for _ in range(int(lengths[f * B + b])):
                v = int(values[pos])
                if v < 0 or v >= r:
                    return [1, f, v, b]
                pos += 1
    return None


def _bad_id_cases(rank: int, world_size: int):
    pg = ProcessGroups.build(timeout=datetime.timedelta(seconds=60))
    sec = ShardedEmbeddingCollection(TABLES, even_plan(TABLES, TYPES, 1, 1), pg, seed=1)
    dist = sec._input_dist
    gen = torch.Generator().manual_seed(11)
    found = []
    for case in range(60):
        F = len(dist.rows)
        lengths = torch.randint(0, 4, (F * B,), generator=gen)
        values = torch.randint(0, 9, (int(lengths.sum()),), generator=gen)
        for _ in range(case % 4):                          # 0 to 3 bad ids anywhere: negative or too large
            if values.numel():
                i = int(torch.randint(0, values.numel(), (1,), generator=gen))
                values[i] = -int(torch.randint(1, 5, (1,), generator=gen)) if case % 2 else 9 + case
        if case % 3 == 0:
            values = values.to(torch.int32)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(values.dtype)
        starts = offsets[::B].tolist()
        found.append((dist._bad_id_error(values, offsets, starts, B), _first_bad_id(values, lengths, dist.rows, B)))
    return found


def test_the_first_bad_id_is_found_by_one_pass_as_by_a_scan():
    """InputDist._bad_id_error (one pass over the ids, one read of the per-feature counts) reports
    the same feature, id and sample as a scan of the batch in order: 60 batches with 0 to 3 bad
    ids each (negative or past the table), int32 and int64 ids, empty bags and features."""
    (found,) = run_multiprocess(_bad_id_cases, 1)
    assert any(want is None for _, want in found) and sum(want is not None for _, want in found) >= 30
    for got, want in found:
        assert got == want
