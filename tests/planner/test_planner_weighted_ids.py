"""Per-id weights in the planner's cost model: a weighted feature's ids travel with 4 bytes more
each (their weight, or their slot in a weight table), and learnable weights (position weights)
cost ``weighted_bag_s`` per bag, ``weighted_id_s`` per id and ``weighted_call_s`` per rank, which
``neo calibrate`` fits to lookups timed with and without ``PositionWeights``. The oracle is the
formulas of docs/planner.md, computed here from the counts of each sharding type."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from neo.planner import ShardingType as T
from neo.planner import Topology, plan_tables
from neo.planner.constants import builtin_constants
from neo.planner.cost import estimate_parts, input_side_split
from neo.planner.step_model import DenseSpec, predict_step
from neo.planner.types import PlanningError, TableConstraints, TableSpec

W, B, F, P = 4, 256, 3, 5.0
C = replace(builtin_constants("cpu"), weighted_call_s=40e-6, weighted_feature_s=7e-6, weighted_bag_s=6e-9,
            weighted_id_s=4e-9)


def _spec(weighted: int = 0, learnable: bool = False, st: T = T.TABLE_WISE) -> TableSpec:
    return TableSpec("t", 4000, 16, num_features=F, pooling_factor=P, constraints=TableConstraints((st,)),
                     weighted_features=weighted, learnable_weights=learnable)


def _parts(spec: TableSpec, st: T, topo: Topology):
    shards = {T.TABLE_WISE: ([4000], [16]), T.ROW_WISE: ([1000] * W, [16] * W),
              T.COLUMN_WISE: ([4000] * 2, [8, 8]), T.DATA_PARALLEL: ([4000] * W, [16] * W)}[st]
    return estimate_parts(spec, st, *shards, topo, C)


@pytest.mark.parametrize("st", [T.TABLE_WISE, T.ROW_WISE, T.COLUMN_WISE, T.DATA_PARALLEL])
@pytest.mark.parametrize("weighted", [1, 3])
def test_weighted_ids_cost_their_bytes_and_learnable_weights_their_pass(st, weighted):
    topo = replace(Topology.uniform(W, 2), batch_size_per_rank=B)
    w = weighted / F
    plain = _parts(_spec(st=st), st, topo)
    fixed = _parts(_spec(weighted, st=st), st, topo)
    learn = _parts(_spec(weighted, True, st=st), st, topo)
    G = B * W
    # the ids a part receives (and their bytes), by sharding type
    ids = {T.TABLE_WISE: G * F * P, T.ROW_WISE: G * F * P / W, T.COLUMN_WISE: G * F * P,
           T.DATA_PARALLEL: (W - 1) * B * F * P}[st]
    id_bytes = C.id_bytes
    extra_bytes = ids * 4.0 * w * (1 if st is T.DATA_PARALLEL else (W - 1) / W)   # what crosses to other ranks
    for got in (fixed, learn):
        assert (got.bytes_intra + got.bytes_inter - plain.bytes_intra - plain.bytes_inter) == \
            pytest.approx([extra_bytes] * len(got.fwd), rel=1e-9)
        assert got.comm_in == pytest.approx(plain.comm_in * (id_bytes + 4.0 * w) / id_bytes, rel=1e-9)
        assert got.fwd == pytest.approx(plain.fwd, rel=1e-12)
    assert fixed.bwd == pytest.approx(plain.bwd, rel=1e-12), "weights needing no gradient cost no pass"
    bags, looked_up = {T.DATA_PARALLEL: (B * F, B * F * P)}.get(st, (G * F, G * F * P / (W if st is T.ROW_WISE else 1)))
    extra = w * (F * C.weighted_feature_s + bags * C.weighted_bag_s + looked_up * C.weighted_id_s)
    assert learn.bwd - plain.bwd == pytest.approx([extra] * len(learn.bwd), rel=1e-9)
    s_in0, *_ = input_side_split(_spec(st=st), st, topo, C)
    s_in1, *_ = input_side_split(_spec(weighted, True, st=st), st, topo, C)
    if st is not T.DATA_PARALLEL:
        assert s_in1 == pytest.approx(s_in0 * (id_bytes + 4.0 * w) / id_bytes, rel=1e-12)


def test_the_step_charges_each_rank_holding_learnable_weights_one_call():
    topo = replace(Topology.uniform(2, 2), batch_size_per_rank=B)
    tables = [TableSpec("a", 3000, 16, pooling_factor=2.0, constraints=TableConstraints((T.TABLE_WISE,))),
              TableSpec("b", 2000, 16, pooling_factor=2.0, constraints=TableConstraints((T.TABLE_WISE,)))]
    plan = plan_tables(tables, topo, C)
    ranks = {name: tp.shards[0].rank for name, tp in plan.tables.items()}
    assert sorted(ranks.values()) == [0, 1]
    dense = DenseSpec(4, (16,), (1,), 2, 16)
    base = predict_step(plan, tables, dense, topo, C)
    weighted = [replace(tables[0], weighted_features=1, learnable_weights=True), tables[1]]
    got = predict_step(plan, weighted, dense, topo, C)
    G = 2 * B
    holder = ranks["a"]
    extra_ms = 1e3 * (C.weighted_call_s + C.weighted_feature_s + G * C.weighted_bag_s + G * 2.0 * C.weighted_id_s)
    assert got.rank_ms[holder] - base.rank_ms[holder] == pytest.approx(extra_ms, rel=1e-3, abs=1e-3)
    assert got.rank_ms[1 - holder] - base.rank_ms[1 - holder] < extra_ms / 5, "only its bytes elsewhere"


@pytest.mark.parametrize("field,value,message", [
    ("weighted_features", 4, r"weighted_features must be an integer in \[0, num_features = 3\]"),
    ("weighted_features", -1, r"weighted_features must be an integer in \[0, num_features = 3\]"),
    ("weighted_features", 1.5, r"weighted_features must be an integer"),
    ("learnable_weights", 1, "learnable_weights must be a bool"),
])
def test_bad_weighted_fields_name_the_table_and_field(field, value, message):
    with pytest.raises(PlanningError, match=rf"table 't': {message}"):
        TableSpec("t", 100, 16, num_features=3, **{field: value})
    with pytest.raises(PlanningError, match="table 't': learnable_weights must be False where no feature is weighted"):
        TableSpec("t", 100, 16, num_features=3, learnable_weights=True)


def test_the_config_marks_position_weighted_features():
    from neo.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "configs" / "tiny.yaml"),
                      ["model.position_weights.sub_category=4", "model.position_weights.user=8"])
    specs = {s.name: (s.num_features, s.weighted_features, s.learnable_weights) for s in cfg.table_specs()}
    assert specs == {"user": (1, 1, True), "item": (1, 0, False), "category": (2, 1, True), "country": (1, 0, False)}


def test_calibration_fits_the_weights_cost_per_call_feature_bag_and_id():
    from neo.calibrate import weighted_constants

    call, feature, bag, per_id = 35e-6, 8e-6, 5e-9, 3e-9
    recs = [{"features": f, "bags": f * b, "ids": f * b * p,
             "seconds": call + f * feature + f * b * bag + f * b * p * per_id}
            for f, b, p in ((1, 2048, 1), (1, 2048, 16), (1, 512, 1), (1, 512, 48), (8, 256, 1), (8, 64, 16))]
    recs.append({"features": 1, "bags": 2048, "ids": 4096, "seconds": 0.0})   # lost in the noise: left out
    got = weighted_constants({"weighted": recs})
    assert got["weighted_call_s"] == pytest.approx(call, rel=1e-6)
    assert got["weighted_feature_s"] == pytest.approx(feature, rel=1e-6)
    assert got["weighted_bag_s"] == pytest.approx(bag, rel=1e-6)
    assert got["weighted_id_s"] == pytest.approx(per_id, rel=1e-6)
    assert weighted_constants({}) == {}


def test_calibrations_weighted_lookups_time_the_lookup_with_and_without_position_weights(monkeypatch):
    """What each record times, seen by spies on the lookup and on PositionWeights: for every
    record, a run of lookups of its ids weighed by PositionWeights, then as many without weights.
    (Not which run is slower: on a shared machine 32k weights' cost can drown in the noise, and did
    once at `--seed-shift 419`, 0.97 against 1.08 ms: a timing is a benchmark's to judge.)"""
    from itertools import groupby

    from neo.calibrate import measure
    from neo.embedding import PositionWeights, TableBatchedEmbedding

    lookups, weighed = [], []         # (weighted, ids) of each lookup in order; each batch PositionWeights gave
    lookup, weigh = TableBatchedEmbedding.forward, PositionWeights.forward

    def spy_lookup(self, batch, *args, **kwargs):
        lookups.append((batch.weights is not None and any(batch.weights is w for w in weighed),
                        batch.values.numel()))
        return lookup(self, batch, *args, **kwargs)

    def spy_weigh(self, batch):
        out = weigh(self, batch)
        weighed.append(out.weights)
        return out

    monkeypatch.setattr(TableBatchedEmbedding, "forward", spy_lookup)
    monkeypatch.setattr(PositionWeights, "forward", spy_weigh)
    recs = measure.weighted_lookups(None, quick=True)
    assert [(r["features"], r["bags"], r["ids"]) for r in recs] == [(1, 2048, 2048), (1, 2048, 32768), (1, 512, 512),
                                                                   (8, 2048, 2048)]
    for r in recs:
        assert r["with"] > 0 and r["without"] > 0 and r["seconds"] == max(r["with"] - r["without"], 0.0)
    runs = [(key, len(list(calls))) for key, calls in groupby(lookups)]
    assert [key for key, _ in runs] == [(w, r["ids"]) for r in recs for w in (True, False)]
    assert all(n >= 9 for _, n in runs)                                    # the quick setting's 9 timed calls and more
    assert [n for _, n in runs[0::2]] == [n for _, n in runs[1::2]]        # as many calls with weights as without
    assert len(weighed) == sum(n for (w, _), n in runs if w)
