"""PlanView: reads the planner's JSON shape and rejects plans the runtime cannot run, naming the table."""

from __future__ import annotations

import json

import pytest

from neo.config.embedding import TableConfig
from neo.distributed.plan_view import PlanError, PlanView, ShardingType, even_plan
from neo.distributed.slots import SlotLayout

TABLES = [TableConfig("a", 10, 8), TableConfig("b", 7, 12, feature_names=("b1", "b2")), TableConfig("c", 5, 4)]


def _plan(**types):
    return even_plan(TABLES, types, world_size=4, local_world_size=2)


@pytest.mark.parametrize("st", [s.value for s in ShardingType])
def test_even_plans_validate(st):
    view = PlanView.from_plan(_plan(a=st, b=st, c="table_wise"), TABLES)
    assert view.tables["a"].sharding_type.value == st
    again = PlanView.from_plan(json.dumps(view.to_dict()), TABLES)          # JSON round trip
    assert again == view


def test_reads_objects_with_to_json():
    class Plan:
        def to_json(self):
            return json.dumps(_plan(a="row_wise", b="column_wise", c="data_parallel"))

    view = PlanView.from_plan(Plan(), TABLES)
    assert [s.rows for s in view.tables["a"].shards] == [3, 3, 2, 2]
    assert [s.cols for s in view.tables["b"].shards] == [8, 4]


def test_gap_and_overlap_are_named():
    p = _plan(a="row_wise", b="table_wise", c="table_wise")
    p["tables"]["a"]["shards"][1]["rows"] = 2
    with pytest.raises(PlanError, match="table 'a'.*gap"):
        PlanView.from_plan(p, TABLES)
    p = _plan(a="row_wise", b="table_wise", c="table_wise")
    p["tables"]["a"]["shards"][1]["row_offset"] = 2
    with pytest.raises(PlanError, match="table 'a'.*overlap"):
        PlanView.from_plan(p, TABLES)


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p["tables"]["a"].update(sharding_type="diagonal"), "sharding_type 'diagonal'"),
    (lambda p: p["tables"]["a"]["shards"][0].update(rank=9), "outside"),
    (lambda p: p["tables"].pop("c"), "no placement for tables \\['c'\\]"),
    (lambda p: p["tables"].update(z=p["tables"]["c"]), "not among the model's tables"),
    (lambda p: p.update(world_size=3), "multiple of local_world_size"),
])
def test_bad_plans(mutate, match):
    p = _plan(a="table_row_wise", b="table_wise", c="table_wise")
    mutate(p)
    with pytest.raises(PlanError, match=match):
        PlanView.from_plan(p, TABLES)


def test_table_row_wise_must_stay_in_one_node():
    p = _plan(a="table_row_wise", b="table_wise", c="table_wise")
    p["tables"]["a"]["shards"][1]["rank"] = 2                     # node 1
    with pytest.raises(PlanError, match="one node"):
        PlanView.from_plan(p, TABLES)


def test_data_parallel_needs_every_rank():
    p = _plan(a="data_parallel", b="table_wise", c="table_wise")
    p["tables"]["a"]["shards"].pop()
    with pytest.raises(PlanError, match="every rank"):
        PlanView.from_plan(p, TABLES)


def test_slot_layout_worked_example():
    tables = [TableConfig("t", 100, 16, feature_names=("a", "b")), TableConfig("u", 10, 8)]
    plan = PlanView.from_plan({"world_size": 2, "local_world_size": 2, "tables": {
        "t": {"sharding_type": "row_wise", "shards": [dict(rank=0, row_offset=0, rows=50, col_offset=0, cols=16),
                                                     dict(rank=1, row_offset=50, rows=50, col_offset=0, cols=16)]},
        "u": {"sharding_type": "table_wise", "shards": [dict(rank=1, row_offset=0, rows=10, col_offset=0, cols=8)]}}},
        tables)
    layout = SlotLayout(tables, plan)
    assert [s.local_feature for s in layout.slots_on[1]] == ["u#0", "a#1", "b#1"]     # table-wise first
    assert [t.name for t in layout.shard_tables_on[1]] == ["u#0", "t#1"]
    assert layout.local_columns(1) == [0, 8, 24, 40]
    assert layout.global_columns(layout.slots_on[1][0]) == list(range(32, 40))
