"""ShardedEmbeddingCollection.state_dict() the TorchRec way: the unsharded module's keys, every sharded
table a ShardedTensor over this rank's live shards, so that plain ``torch.distributed.checkpoint``
saves it under one plan and loads it under another, into one unsharded process, and an unsharded
module's full tensors load into the shards; a wrong table is an error naming it.

Every oracle compares against the saved (or unsharded) state bit for bit and first checks that
the target differed before the load, so a load that did nothing fails."""

from __future__ import annotations

import datetime
import warnings
from dataclasses import replace
from typing import Any, Dict, List

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.api import CheckpointException

from distributed_cases import ALL_TYPES, Case, global_batches, initial_tables, local_slice, tables
from neo.config.embedding import OptimizerConfig, TableConfig
from neo.distributed import ProcessGroups, ShardedEmbeddingCollection
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch
from tests.multiprocess import run_multiprocess

ADAGRAD = OptimizerConfig("adagrad", lr=0.3, initial_accumulator_value=0.1)
ROWWISE = OptimizerConfig("rowwise_adagrad", lr=0.3, initial_accumulator_value=0.1)
W, L = 2, 2


def _types(ts: List[TableConfig], shift: int) -> Dict[str, str]:
    """Table i gets sharding type ALL_TYPES[(i + shift) % 6]: every type, each table another one per shift."""
    return {t.name: ALL_TYPES[(i + shift) % len(ALL_TYPES)] for i, t in enumerate(ts)}


def _pg() -> ProcessGroups:
    return ProcessGroups.build(L, timeout=datetime.timedelta(seconds=60))


def _trained(case: Case, pg: ProcessGroups, rank: int, steps: int = 2, seed: int = 0) -> ShardedEmbeddingCollection:
    """The case's collection from the case's initial tables, ``steps`` fused updates on its batches."""
    sec = ShardedEmbeddingCollection(case.tables, case.plan(), pg, seed=seed)
    sec.load_full_weights(initial_tables(case))
    for batch in global_batches(case)[:steps]:
        sec(local_slice(batch, rank, case.batch_size)).square().mean().backward()
    return sec


def _snapshot(sec: ShardedEmbeddingCollection) -> Dict[str, Any]:
    """Full tables and optimizer state (collective) and this rank's update counters."""
    steps = sec.lookup.optimizer_steps() if sec.lookup is not None else {}
    return {"weights": sec.full_weights(), "states": sec.full_optimizer_state(), "steps": sorted(set(steps.values()))}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _error(fn) -> str:
    """The message of what ``fn()`` raises (DCP's CheckpointException is a BaseException)."""
    try:
        fn()
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        return str(e)
    raise AssertionError("no error")


def _save_then_dcp_load(sec, sd, ts, plan, pg, seed: int, path: str):
    """``dcp.save(sd)`` of ``sec``, then a fresh collection under ``plan`` and ``dcp.load`` into its
    ``state_dict()``: (``sec``'s snapshot, the new one's before the load, the new collection, its
    filled state dict); ``load_state_dict`` is the caller's."""
    dcp.save(sd, checkpoint_id=path)
    saved = _snapshot(sec)
    sec2 = ShardedEmbeddingCollection(ts, plan, pg, seed=seed)
    before = _snapshot(sec2)
    sd2 = sec2.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    return saved, before, sec2, sd2


# ------------------------------------------------------------------ (i) plan A -> plan B, and (ii)
def _save_then_load_under_another_plan(rank: int, world_size: int, path: str) -> Dict[str, Any]:
    pg = _pg()
    ts = tables(6, ADAGRAD)
    a, b = Case("A", ts, _types(ts, 0), world_size, L), Case("B", ts, _types(ts, 2), world_size, L)
    sec = _trained(a, pg, rank)
    sd = sec.state_dict()
    live = {}                                  # every local shard a view of the live weights
    for t in ts:
        value = sd[f"{t.name}.weight"]
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                k = next(k for k, s in enumerate(sec.plan.tables[t.name].shards) if s.rank == rank
                         and [s.row_offset, s.col_offset] == shard.metadata.shard_offsets)
                live[t.name] = shard.tensor.data_ptr() == sec.lookup.table_weight(f"{t.name}#{k}").data_ptr()
    saved, before, sec2, sd2 = _save_then_dcp_load(sec, sd, ts, b.plan(), pg, 11, path)
    after_dcp = sec2.full_weights()            # dcp.load wrote straight into the live shards
    result = sec2.load_state_dict(sd2)
    held = [t.name for t in ts if any(s.rank == rank and s.rows and s.cols for s in sec.plan.tables[t.name].shards)]
    return {"keys": list(sd), "kinds": {k: type(v).__name__ for k, v in sd.items()}, "live": live, "held": held,
            "saved": saved, "before": before, "after_dcp": after_dcp, "loaded": _snapshot(sec2),
            "result": (list(result.missing_keys), list(result.unexpected_keys))}


def test_dcp_save_under_one_plan_loads_under_another_and_into_one_process(tmp_path):
    """(i) W=2, every sharding type, Adagrad trained 2 steps: dcp.save(state_dict()) under plan A,
    dcp.load + load_state_dict under plan B (every table another type) restores tables, state and
    step bit for bit; (ii) the same checkpoint loads into an unsharded module in one process."""
    path = str(tmp_path / "ck")
    got = run_multiprocess(_save_then_load_under_another_plan, W, path)
    ts = tables(6, ADAGRAD)
    unsharded_keys = list(TableBatchedEmbedding(ts, backend="reference").state_dict())
    assert any(len(out["held"]) < len(ts) for out in got), "some rank should lack a table"
    for rank, out in enumerate(got):
        # the unsharded module's keys, a table's step only where the rank holds a shard of it
        assert out["keys"] == [k for k in unsharded_keys if not k.endswith(".step") or k[:-5] in out["held"]], rank
        types = _types(ts, 0)
        for t in ts:
            kind = "Tensor" if types[t.name] == "data_parallel" else "ShardedTensor"
            assert out["kinds"][f"{t.name}.weight"] == kind and out["kinds"][f"{t.name}.sum"] == kind, t.name
            assert out["kinds"].get(f"{t.name}.step", "Tensor") == "Tensor"
        assert out["live"] and all(out["live"].values()), f"rank {rank}: {out['live']}"
        saved = out["saved"]
        assert saved["steps"] == [2]
        assert not _equal(out["before"]["weights"], saved["weights"])
        assert not _equal(out["before"]["states"], saved["states"]) and out["before"]["steps"] == [0]
        assert _equal(out["after_dcp"], saved["weights"]), f"rank {rank}: dcp.load did not write the live shards"
        assert _equal(out["loaded"], saved), f"rank {rank}: the loaded collection differs from the saved one"
        assert out["result"] == ([], [])

    emb = TableBatchedEmbedding(ts, backend="reference", seed=5)                   # (ii) one process, no group
    assert not _equal({t.name: emb.table_weight(t.name) for t in ts}, got[0]["saved"]["weights"])
    sd = emb.state_dict()
    with warnings.catch_warnings():                 # "torch.distributed is disabled ...": meant so here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    emb.load_state_dict(sd)
    assert _equal({t.name: emb.table_weight(t.name) for t in ts}, got[0]["saved"]["weights"])
    assert _equal({t.name: emb.table_optimizer_state(t.name) for t in ts}, got[0]["saved"]["states"])
    assert set(emb.optimizer_steps().values()) == {2}


# ------------------------------------------------------------------ (iii) full tensors
def _unsharded_trained(ts: List[TableConfig], case: Case) -> TableBatchedEmbedding:
    """An unsharded module trained 2 steps on the global batches (other weights than the case's start)."""
    emb = TableBatchedEmbedding(ts, backend="reference", seed=3)
    for batch in global_batches(case)[:2]:
        emb(batch).square().mean().backward()
    return emb


class _UserModel(nn.Module):
    def __init__(self, ebc: nn.Module):
        super().__init__()
        self.ebc = ebc
        self.top = nn.Linear(1, 1)


def _load_full_tensors(rank: int, world_size: int) -> Dict[str, Any]:
    pg = _pg()
    ts = tables(6, OptimizerConfig("adam", lr=0.05))
    case = Case("A", ts, _types(ts, 0), world_size, L)
    emb = _unsharded_trained(ts, case)
    full = {f"ebc.{k}": v.clone() for k, v in emb.state_dict().items()}
    model = _UserModel(ShardedEmbeddingCollection(ts, case.plan(), pg, seed=7))
    full.update({f"top.{k}": v for k, v in model.top.state_dict().items()})
    before = _snapshot(model.ebc)
    result = model.load_state_dict(full)
    want = {"weights": {t.name: emb.table_weight(t.name) for t in ts},
            "states": {t.name: {k: v.clone() for k, v in emb.table_optimizer_state(t.name).items()} for t in ts},
            "steps": sorted(set(emb.optimizer_steps().values()))}
    return {"before": before, "loaded": _snapshot(model.ebc), "want": want,
            "result": (list(result.missing_keys), list(result.unexpected_keys)),
            "keys": sorted(model.state_dict())}


def test_an_unsharded_modules_full_tensors_load_into_the_shards():
    """(iii) An unsharded module's state dict (full tensors, Adam, 2 steps), under a user model's
    attribute: each rank copies its shards' slices; tables, state and step equal the unsharded
    module's bit for bit; no key is missing or unexpected (the local module's keys neither)."""
    got = run_multiprocess(_load_full_tensors, W)
    for rank, out in enumerate(got):
        want = out["want"]
        assert want["steps"] == [2]
        assert not _equal(out["before"]["weights"], want["weights"]) and out["before"]["steps"] == [0]
        assert _equal(out["loaded"], want), f"rank {rank}"
        assert out["result"] == ([], [])
        assert not [k for k in out["keys"] if ".lookup." in k or "#" in k], out["keys"]


# ------------------------------------------------------------------ (iv) errors
def _errors(rank: int, world_size: int) -> Dict[str, Any]:
    pg = _pg()
    ts = tables(6, ADAGRAD)
    case = Case("A", ts, _types(ts, 0), world_size, L)
    sec = ShardedEmbeddingCollection(ts, case.plan(), pg)
    good = TableBatchedEmbedding(ts, backend="reference").state_dict()
    wrong = [replace(t, num_rows=t.num_rows + 3) if t.name == "t1" else t for t in ts]
    out: Dict[str, Any] = {"shape": _error(lambda: sec.load_state_dict(TableBatchedEmbedding(wrong).state_dict()))}
    partial = {k: v for k, v in good.items() if not k.startswith("t2.")}
    out["missing_strict"] = _error(lambda: sec.load_state_dict(partial))
    res = sec.load_state_dict(dict(partial, **{"t9.weight": torch.zeros(3, 3)}), strict=False)
    out["missing"], out["unexpected"] = sorted(res.missing_keys), sorted(res.unexpected_keys)
    other = ShardedEmbeddingCollection(ts, Case("B", ts, _types(ts, 2), world_size, L).plan(), pg)
    out["other_shards"] = _error(lambda: sec.load_state_dict(other.state_dict()))
    donor = _trained(case, pg, rank)                     # the earlier rank-local keys, same plan: still load
    res = sec.load_state_dict({f"lookup.{k}": v for k, v in donor.lookup.state_dict().items()})
    out["rank_local"] = (list(res.missing_keys), list(res.unexpected_keys), _equal(sec.full_weights(),
                                                                                   donor.full_weights()))
    return out


def test_a_wrong_table_is_an_error_naming_it():
    """(iv) A table of another shape: an error naming the table and its key only; a missing
    table: strict raises naming its keys, strict=False returns them (and no key of the local
    module); an unknown table is unexpected; another plan's ShardedTensors, given without
    dcp.load, are refused naming the table. The earlier rank-local keys (``lookup.t0#0.weight``,
    same plan) still load, through the local module."""
    got = run_multiprocess(_errors, W)
    for out in got:
        assert "table 't1'" in out["shape"] and "t1.weight is (28, 16)" in out["shape"], out["shape"]
        assert "table 't0'" not in out["shape"] and "table 't2'" not in out["shape"]
        assert "Missing key(s)" in out["missing_strict"] and '"t2.weight"' in out["missing_strict"]
        assert out["missing"] == ["t2.step", "t2.sum", "t2.weight"] and out["unexpected"] == ["t9.weight"]
        assert "dcp.load" in out["other_shards"] and "table 't0'" in out["other_shards"], out["other_shards"]
        assert out["rank_local"] == ([], [], True)


# ------------------------------------------------------------------ per-row state of column-split tables
def _rowwise_bands(rank: int, world_size: int, path: str) -> Dict[str, Any]:
    pg = _pg()
    ts = tables(3, ROWWISE)
    types = {"t0": "column_wise", "t1": "row_wise", "t2": "table_column_wise"}
    case = Case("A", ts, types, world_size, L)
    sec = _trained(case, pg, rank)
    sd = sec.state_dict()
    dcp.save(sd, checkpoint_id=path)
    local = lambda s: {n: {k: v.clone() for k, v in s.lookup.table_optimizer_state(n).items()}      # noqa: E731
                       for n in (x.name for x in s.lookup.tables)}
    sec2 = ShardedEmbeddingCollection(ts, case.plan(), pg, seed=3)
    before = local(sec2)
    sd2 = sec2.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    sec2.load_state_dict(sd2)
    other = ShardedEmbeddingCollection(ts, Case("B", ts, dict(types, t0="table_wise"), world_size, L).plan(), pg)
    full = TableBatchedEmbedding(ts, backend="reference").state_dict()
    return {"keys": sorted(sd), "saved": local(sec), "before": before, "loaded": local(sec2),
            "weights": (sec.full_weights(), sec2.full_weights()),
            "other_bands": _error(lambda: dcp.load(other.state_dict(), checkpoint_id=path)),
            "full": _error(lambda: sec2.load_state_dict(full))}


def test_per_row_state_of_column_split_tables_is_kept_per_band(tmp_path):
    """Row-wise Adagrad on tables split by columns: the state dict holds each band's per-row state
    (``t0.sum@0:4``, ...); it loads into the same bands bit for bit; another layout is an error
    naming the key (dcp.load) or the table (load_state_dict of the unsharded module's state)."""
    got = run_multiprocess(_rowwise_bands, W, str(tmp_path / "ck"))
    for rank, out in enumerate(got):
        assert {"t0.sum@0:4", "t0.sum@4:8", "t1.sum", "t2.sum@0:8", "t2.sum@8:12"} <= set(out["keys"]), out["keys"]
        assert "t0.sum" not in out["keys"] and "t2.sum" not in out["keys"]
        assert not _equal(out["before"], out["saved"])
        assert _equal(out["loaded"], out["saved"]), f"rank {rank}"
        assert _equal(*out["weights"])
        assert "Missing key in checkpoint state_dict: t0.sum." in out["other_bands"], out["other_bands"]
        assert "table 't0'" in out["full"] and "column band" in out["full"], out["full"]
        assert "table 't1'" not in out["full"]


# ------------------------------------------------------------------ cached tables
def _rows_of_every_quarter(ts: List[TableConfig], GB: int) -> KeyedJaggedBatch:
    """A global batch of GB samples whose every bag holds a row from each quarter of its table: a step on
    it trains rows of every shard of every table under any split into two (a random batch of a few ids
    can miss a rank's row range: then nothing of that rank's is written back, and its load is rightly
    accepted)."""
    return KeyedJaggedBatch.from_lists({f: [[q * t.num_rows // 4 + j for q in range(4)] for j in range(GB)]
                                        for t in ts for f in t.feature_names})


def _cached(rank: int, world_size: int, path: str) -> Dict[str, Any]:
    pg = _pg()
    cached = dict(num_rows=400, placement="cached", cache_rows=160, cache_store="host")    # 2/5 of a shard's rows
    ts = [replace(t, **cached) for t in tables(3, ADAGRAD)]
    types = {"t0": "row_wise", "t1": "table_wise", "t2": "column_wise"}
    case = Case("A", ts, types, world_size, L, batch_size=2)
    b = Case("B", ts, {"t0": "table_wise", "t1": "row_wise", "t2": "row_wise"}, world_size, L, batch_size=2)
    sec = _trained(case, pg, rank)
    sd = sec.state_dict()
    saved, before, sec2, sd2 = _save_then_dcp_load(sec, sd, ts, b.plan(), pg, 5, path)
    sec2.load_state_dict(sd2)
    loaded = _snapshot(sec2)
    late = _trained(b, pg, rank, steps=0, seed=9)           # state_dict(), a step, then dcp.load: refused
    sd3 = late.state_dict()
    step = _rows_of_every_quarter(ts, world_size * b.batch_size)                # rows of every rank's shards
    late(local_slice(step, rank, b.batch_size)).square().mean().backward()
    dcp.load(sd3, checkpoint_id=path)
    return {"saved": saved, "before": before, "loaded": loaded, "late": _error(lambda: late.load_state_dict(sd3))}


def test_cached_tables_load_through_their_backing_store(tmp_path):
    """Cached tables (host store): state_dict() writes the cache back and its entries are the
    backing stores; dcp.save under one plan, dcp.load + load_state_dict under another restore
    them bit for bit. A step between state_dict() and dcp.load (its rows written back over what
    dcp.load read) is refused, naming the table, rather than silently lost."""
    got = run_multiprocess(_cached, W, str(tmp_path / "ck"))
    for rank, out in enumerate(got):
        assert out["saved"]["steps"] == [2]
        assert not _equal(out["before"]["weights"], out["saved"]["weights"])
        assert _equal(out["loaded"], out["saved"]), f"rank {rank}"
        assert "table 't" in out["late"] and "state_dict()" in out["late"] and "cached" in out["late"], out["late"]


# ------------------------------------------------------------------ a rank without shards
def _rank_without_shards(rank: int, world_size: int, path: str) -> Dict[str, Any]:
    pg = _pg()
    ts = tables(1, OptimizerConfig("adam", lr=0.05))
    a = Case("A", ts, {"t0": "table_wise"}, world_size, L)                  # all on rank 0: rank 1 holds nothing
    sec = _trained(a, pg, rank)
    sd = sec.state_dict()
    dcp.save(sd, checkpoint_id=path)
    saved = _snapshot(sec)
    sec2 = ShardedEmbeddingCollection(ts, Case("B", ts, {"t0": "row_wise"}, world_size, L).plan(), pg, seed=4)
    sd2 = sec2.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    sec2.load_state_dict(sd2)
    res = sec.load_state_dict(TableBatchedEmbedding(ts, backend="reference").state_dict())
    return {"keys": sorted(sd), "local": sec.lookup is not None, "saved": saved, "loaded": _snapshot(sec2),
            "result": (list(res.missing_keys), list(res.unexpected_keys))}


def test_a_rank_without_shards_leaves_the_step_to_the_others(tmp_path):
    """A rank that holds no shard takes no updates: its state dict has no ``<table>.step`` (so DCP
    writes the holder's count, not a 0), it accepts one on load; the tables and Adam's step count
    load under another plan."""
    got = run_multiprocess(_rank_without_shards, W, str(tmp_path / "ck"))
    assert [out["local"] for out in got] == [True, False]
    assert got[0]["keys"] == ["t0.exp_avg", "t0.exp_avg_sq", "t0.step", "t0.weight"]
    assert got[1]["keys"] == ["t0.exp_avg", "t0.exp_avg_sq", "t0.weight"]
    for rank, out in enumerate(got):
        assert _equal(out["loaded"]["weights"], got[0]["saved"]["weights"])
        assert _equal(out["loaded"]["states"], got[0]["saved"]["states"])
        assert out["loaded"]["steps"] == [2], f"rank {rank}"
        assert out["result"] == ([], [])


def _counts_differ_by_table(rank: int, world_size: int, path: str) -> Dict[str, Any]:
    pg = _pg()
    ts = [TableConfig(f"t{k}", num_rows=10, dim=4, feature_names=[f"f{k}"],
                      optimizer=OptimizerConfig("adam", lr=0.01 * (k + 1))) for k in range(3)]   # a group each
    a = Case("A", ts, {t.name: "table_wise" for t in ts}, world_size, L)
    sec = ShardedEmbeddingCollection(ts, a.plan(), pg)
    # e.g. a fine-tune: two tables' counters restored from a checkpoint, a new table starting at 0
    result = sec.load_state_dict({"t0.step": torch.tensor(1000), "t2.step": torch.tensor(1000)}, strict=False)
    owners = {t.name: sorted({s.rank for s in sec.plan.tables[t.name].shards}) for t in ts}
    sd = sec.state_dict()
    dcp.save(sd, checkpoint_id=path)
    b = Case("B", ts, {t.name: "row_wise" for t in ts}, world_size, L)
    sec2 = ShardedEmbeddingCollection(ts, b.plan(), pg)
    sd2 = sec2.state_dict()
    dcp.load(sd2, checkpoint_id=path)
    sec2.load_state_dict(sd2)
    return {"owners": owners, "step_keys": sorted(k for k in sd if k.endswith(".step")),
            "loaded": {t.name: sec2.lookup.optimizer_steps()[f"{t.name}#{rank}"] for t in ts},
            "missing": list(result.missing_keys)}


def test_each_tables_step_comes_from_the_ranks_holding_it(tmp_path):
    """Tables of different groups count different updates (a table added to a fine-tune starts at
    0): a rank writes ``<table>.step`` only for the tables it holds, so DCP cannot keep another
    rank's count for it, and under another plan every table gets its own count back."""
    got = run_multiprocess(_counts_differ_by_table, W, str(tmp_path / "ck"))
    owners = got[0]["owners"]
    assert owners["t0"] != owners["t2"] or owners["t1"] != owners["t0"], owners     # some rank lacks some table
    for rank, out in enumerate(got):
        assert out["step_keys"] == sorted(f"{t}.step" for t, r in owners.items() if r == [rank]), (rank, out)
        assert out["loaded"] == {"t0": 1000, "t1": 0, "t2": 1000}, f"rank {rank}: {out['loaded']}"


# ------------------------------------------------------------------ model and dense optimizer
def _model_and_optimizer_in_two_saves(rank: int, world_size: int, path: str) -> Dict[str, Any]:
    """A user model (the collection and a dense layer) and its dense optimizer (SGD with momentum,
    state per parameter), saved with plain DCP in two saves, loaded into fresh ones (the docs'
    way where some rank holds no shard of some table: table-wise tables here)."""
    pg = _pg()
    ts = tables(4, ADAGRAD)
    case = Case("tw", ts, {t.name: "table_wise" for t in ts}, world_size, L)
    model = _UserModel(_trained(case, pg, rank))
    opt = torch.optim.SGD(model.top.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        model.top(torch.ones(3, 1)).sum().backward()
        opt.step()
    dcp.save(model.state_dict(), checkpoint_id=f"{path}/model")
    dcp.save(opt.state_dict(), checkpoint_id=f"{path}/optim")
    model2 = _UserModel(ShardedEmbeddingCollection(ts, case.plan(), pg, seed=9))
    opt2 = torch.optim.SGD(model2.top.parameters(), lr=0.5, momentum=0.5)
    model2.top(torch.ones(3, 1)).sum().backward()
    opt2.step()                                                  # state to be overwritten
    sd = model2.state_dict()
    dcp.load(sd, checkpoint_id=f"{path}/model")
    model2.load_state_dict(sd)
    osd = opt2.state_dict()
    dcp.load(osd, checkpoint_id=f"{path}/optim")
    opt2.load_state_dict(osd)
    held = [t.name for t in ts if any(s.rank == rank for s in model.ebc.plan.tables[t.name].shards)]
    errors = []                                  # full tables of another shape or name: named, nothing copied
    for bad in ({"t0": torch.zeros(3, 3)}, {"nope": torch.zeros(1, 1)}):
        try:
            model2.ebc.load_full_weights(bad)
        except ValueError as e:
            errors.append(str(e))
    return {"held": held, "errors": errors, "after_bad": _snapshot(model2.ebc), "saved": _snapshot(model.ebc), "loaded": _snapshot(model2.ebc),
            "top": [torch.equal(a, b) for a, b in zip(model.top.parameters(), model2.top.parameters())],
            "momentum": [torch.equal(opt.state[a]["momentum_buffer"], opt2.state[b]["momentum_buffer"])
                         for a, b in zip(model.top.parameters(), model2.top.parameters())],
            "groups": (opt2.param_groups[0]["lr"], opt2.param_groups[0]["momentum"])}


def test_model_and_dense_optimizer_load_back_from_two_dcp_saves(tmp_path):
    got = run_multiprocess(_model_and_optimizer_in_two_saves, W, str(tmp_path / "ck"))
    assert any(len(out["held"]) < 4 for out in got), "some rank should hold no shard of some table"
    for rank, out in enumerate(got):
        assert _equal(out["loaded"], out["saved"]), rank
        assert all(out["top"]) and all(out["momentum"]) and out["groups"] == (0.1, 0.9), (rank, out)
        assert "table 't0' is 20 x 8, the tensor given is (3, 3)" in out["errors"][0], out["errors"]
        assert "no table named 'nope'" in out["errors"][1] and _equal(out["after_bad"], out["saved"])
