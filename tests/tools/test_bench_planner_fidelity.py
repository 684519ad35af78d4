"""tools/bench_planner_fidelity.py: the verdict pools the runs of one plan under two names, and
a plan's signature is its shards (pure functions, no training)."""

from __future__ import annotations

import json

from tests.tools import load_tool

fidelity = load_tool("bench_planner_fidelity.py")


def _runs(**plans):
    return {name: [{"plan_signature": sig, "measured_step_ms": ms} for ms in times] for name, (sig, times) in
            plans.items()}


def test_the_planners_plan_under_another_name_is_pooled_with_it():
    v = fidelity.verdict(_runs(planner=("A", [6.3, 6.9, 7.5]), table_wise=("A", [5.9, 5.4, 6.4]),
                               row_wise=("B", [8.5, 7.2, 8.6])))
    assert v["same_as"] == ["table_wise"]
    assert v["planner_ms"] == v["fastest_ms"] == 6.35          # the median of the six runs of plan A
    assert v["planner_over_fastest"] == 1.0
    assert v["fastest"] == "planner/table_wise"


def test_a_slower_planner_plan_is_reported_as_such():
    v = fidelity.verdict(_runs(planner=("A", [7.0, 7.2, 7.1]), table_wise=("B", [6.0, 6.1, 5.9]),
                               second_best=("C", [9.0, 9.0, 9.0])))
    assert v["same_as"] == [] and v["fastest"] == "table_wise"
    assert v["planner_over_fastest"] == round(7.1 / 6.0, 3)


def test_rounds_that_place_the_tables_differently_are_judged_round_by_round():
    """zipf_mix at W = 4: each round's constants placed the tables differently, the planner's
    plan being table-wise's in both; pooled across rounds the planner's round-0 placement (the
    slower round) met the round-1 placement as if they were rivals: 1.079x. Round by round the
    planner's plan is the fastest in each."""
    runs = {"planner": [{"plan_signature": "A", "measured_step_ms": 72.0, "round": 0},
                        {"plan_signature": "B", "measured_step_ms": 64.4, "round": 1}],
            "table_wise": [{"plan_signature": "A", "measured_step_ms": 68.8, "round": 0},
                           {"plan_signature": "B", "measured_step_ms": 66.1, "round": 1}],
            "row_wise": [{"plan_signature": "C", "measured_step_ms": 88.5, "round": 0},
                         {"plan_signature": "C", "measured_step_ms": 99.5, "round": 1}]}
    v = fidelity.verdict(runs)
    assert v["planner_over_fastest"] == 1.0 and len(v["by_round"]) == 2
    assert [r["same_as"] for r in v["by_round"]] == [["table_wise"], ["table_wise"]]
    runs["row_wise"][1]["measured_step_ms"] = 60.0                # row-wise faster in round 1 only
    v = fidelity.verdict(runs)
    assert v["by_round"][1]["planner_over_fastest"] == round(65.25 / 60.0, 3)
    assert v["planner_over_fastest"] == round((1.0 + round(65.25 / 60.0, 3)) / 2, 3)


def test_plan_signature_is_the_shards_and_nothing_else(tmp_path):
    def write(name, shards, placement="device", extra=None):
        doc = {"world_size": 2, "summary": {"predicted_step_ms": extra},
               "tables": {"t": {"sharding_type": "table_wise", "placement": placement, "shards": shards}}}
        (tmp_path / name).write_text(json.dumps(doc))
        return fidelity.plan_signature(str(tmp_path / name))

    a = write("a.json", [{"rank": 0, "rows": 10}], extra=1.0)
    assert write("b.json", [{"rank": 0, "rows": 10}], extra=2.0) == a     # the summary is not the plan
    assert write("c.json", [{"rank": 1, "rows": 10}]) != a
    assert write("d.json", [{"rank": 0, "rows": 10}], placement="cached") != a


def test_most_common_is_the_most_frequent_plan():
    assert fidelity.most_common(["A", "B", "A"]) == "A"
    assert fidelity.most_common(["B", "A"]) == "B"                  # a tie: the first one run
