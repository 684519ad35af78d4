"""Heterogeneous virtual workers: devices grouped by speed (the best spread, checked by brute force),
each worker's dense layers split in proportion to its devices' speeds, the planner's embedding
placement weighing the same speeds, and the report of a config."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from neo.async_train.virtual_workers import group_virtual_workers, main, split_dense, virtual_worker_plan
from neo.config import config_from_dict
from neo.pipeline.partition import PartitionError, profile_from_dict


def _spread(groups, speeds):
    totals = [sum(speeds[d] for d in g) for g in groups]
    return max(totals) - min(totals)


def _best_spread(speeds, k):
    best = float("inf")
    for labels in itertools.product(range(k), repeat=len(speeds)):
        if len(set(labels)) == k:
            best = min(best, _spread([[d for d, l in enumerate(labels) if l == g] for g in range(k)], speeds))
    return best


def test_groups_are_a_partition_and_near_the_best_spread():
    rng = random.Random(0)
    exact = 0
    for trial in range(60):
        n = rng.randint(2, 7)
        k = rng.randint(1, n)
        speeds = [rng.choice([0.25, 0.5, 1.0, 1.0, 2.0]) * rng.uniform(0.9, 1.1) for _ in range(n)]
        groups = group_virtual_workers(speeds, k)
        assert sorted(d for g in groups for d in g) == list(range(n)) and len(groups) == k
        assert all(g for g in groups)
        best = _best_spread(speeds, k)
        got = _spread(groups, speeds)
        assert got <= best + 0.5 * max(speeds) + 1e-9            # within half the fastest device of optimal
        exact += got <= best + 1e-9
    assert exact >= 45                                           # optimal in most cases


def test_group_examples_and_errors():
    assert group_virtual_workers([1, 1, 1, 1 / 3], 2) == [[0, 2], [1, 3]]
    assert group_virtual_workers([4, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4]]     # one fast device = four slow ones
    assert group_virtual_workers([1, 1], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="3 virtual workers for 2 devices: a virtual worker with no device"):
        group_virtual_workers([1, 1], 3)
    with pytest.raises(ValueError, match=r"devices\[1\]: speed"):
        group_virtual_workers([1, 0], 1)


PROFILE = profile_from_dict({"bandwidth_gbps": 1000.0, "layers": [
    {"name": f"l{k}", "fwd_ms": 1.0, "bwd_ms": 1.0, "activation_bytes": 0, "param_bytes": 0} for k in range(12)]})
"""12 equal layers of 2 ms, free transfers: a stage's work is just its layer count."""


def test_dense_split_follows_speed():
    speeds = [1.0, 1.0, 2.0, 0.5]
    (vw,) = split_dense(PROFILE, [[0, 2, 3]], speeds)
    layers = {d: b - a + 1 for d, (a, b) in zip(vw["devices"], vw["stages"])}
    assert sum(layers.values()) == 12 and layers[2] >= layers[0] >= layers[3]
    # a stage of n layers on speed s takes 2n/s ms: max(2 n0, n2, 4 n3) with n0 + n2 + n3 = 12 is at least 8
    assert vw["bottleneck_ms"] == pytest.approx(8.0)
    even, mixed = split_dense(PROFILE, [[0, 1], [2, 3]], speeds)
    assert sorted(b - a + 1 for a, b in even["stages"]) == [6, 6] and even["bottleneck_ms"] == pytest.approx(12.0)
    assert {d: b - a + 1 for d, (a, b) in zip(mixed["devices"], mixed["stages"])} == {2: 10, 3: 2}
    with pytest.raises(PartitionError, match=r"groups\[0\]"):
        split_dense(PROFILE, [list(range(13))], [1.0] * 13)


def _cfg(speed_of_3: float):
    return config_from_dict({
        "topology": {"world_size": 4, "local_world_size": 4, "devices": [{"ranks": [3], "speed": speed_of_3}]},
        "tables": [{"name": f"t{k}", "num_rows": 100_000, "dim": 64, "pooling_factor": 10} for k in range(24)]})


def test_the_planner_weighs_device_speed_for_embeddings():
    from neo.planner import plan_tables

    cfg = _cfg(0.25)
    plan = plan_tables(cfg.table_specs(), cfg.topology.to_topology())          # the built-in constants
    fast = np.mean([r.compute_ms for r in plan.ranks[:3]])
    assert plan.ranks[3].compute_ms * 0.25 < 0.6 * fast          # lookup work on rank 3 = its time x its speed
    uniform = _cfg(1.0)
    even = plan_tables(uniform.table_specs(), uniform.topology.to_topology())
    assert even.ranks[3].compute_ms * 1.0 > plan.ranks[3].compute_ms * 0.25


def test_virtual_worker_plan_of_a_config(tmp_path, capsys):
    cfg = _cfg(1 / 3)
    report = virtual_worker_plan(cfg, 2, PROFILE)
    assert report["virtual_workers"] == [[0, 2], [1, 3]] and report["total_speed"] == [2.0, pytest.approx(1.333333, 1e-5)]
    assert [len(w["stages"]) for w in report["dense_split"]] == [2, 2]
    slow = report["dense_split"][1]
    layers = {d: b - a + 1 for d, (a, b) in zip(slow["devices"], slow["stages"])}
    assert layers[1] > layers[3]                                 # the fast device takes more layers
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE.to_dict()))
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"topology": {"world_size": 4, "local_world_size": 4,
                                             "devices": [{"ranks": [3], "speed": 0.5}]},
                                "tables": [{"name": "t", "num_rows": 10, "dim": 8}]}))
    assert main([str(conf), "--workers", "2", "--profile", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["virtual_workers"] == [[0, 2], [1, 3]] and len(out["dense_split"]) == 2
    assert main([str(conf), "--workers", "5"]) == 2
    assert "a virtual worker with no device" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--workers", "2", "--world-size", "0"], "--world-size"),
    (["--workers", "2", "--world-size", "-2"], "--world-size"),
    (["--workers", "2", "--local-world-size", "-4"], "--local-world-size"),
    (["--workers", "0"], "--workers"),
    (["--workers", "-1"], "--workers"),
    (["--workers", "2", "--profile", "P", "--bandwidth-gbps", "-1"], "--bandwidth-gbps"),
    (["--workers", "2", "--profile", "P", "--bandwidth-gbps", "0"], "--bandwidth-gbps"),
    (["--workers", "2", "--profile", "P", "--bandwidth-gbps", "nan"], "--bandwidth-gbps"),
    (["--workers", "2", "--profile", "P", "--bandwidth-gbps", "inf"], "--bandwidth-gbps"),
])
def test_cli_refuses_bad_numbers_naming_the_flag(tmp_path, capsys, flags, named):
    """A world size, worker count or bandwidth that is not a positive (finite) number is a usage
    error naming the flag, not a fallback to the config's world size or a silent no-op."""
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"topology": {"world_size": 4, "local_world_size": 4},
                                "tables": [{"name": "t", "num_rows": 10, "dim": 8}]}))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE.to_dict()))
    with pytest.raises(SystemExit) as e:
        main([str(conf)] + [str(path) if f == "P" else f for f in flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {named}" in err and "Traceback" not in err


def test_cli_refuses_bandwidth_without_a_profile(tmp_path, capsys):
    """--bandwidth-gbps only sets the dense split's transfers, which need --profile: alone it would do nothing."""
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"topology": {"world_size": 4, "local_world_size": 4},
                                "tables": [{"name": "t", "num_rows": 10, "dim": 8}]}))
    assert main([str(conf), "--workers", "2", "--bandwidth-gbps", "10"]) == 2
    assert "--bandwidth-gbps needs --profile" in capsys.readouterr().err


def test_plan_refuses_a_world_size_below_one():
    with pytest.raises(ValueError, match="world_size: must be an integer >= 1, got 0"):
        virtual_worker_plan(_cfg(1.0), 2, world_size=0)
    with pytest.raises(ValueError, match="local_world_size: must be an integer >= 1, got 0"):
        virtual_worker_plan(_cfg(1.0), 2, local_world_size=0)


def test_cli_local_world_size_fits_a_smaller_world_size(tmp_path, capsys):
    """``--world-size 2`` against a config of 4 ranks a node is not a whole node; ``--local-world-size``
    sets the node size from the command line (the config's by default)."""
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"topology": {"world_size": 4, "local_world_size": 4},
                                "tables": [{"name": "t", "num_rows": 10, "dim": 8}]}))
    assert main([str(conf), "--workers", "2", "--world-size", "2"]) == 2
    assert "not a multiple of local_world_size 4" in capsys.readouterr().err
    assert main([str(conf), "--workers", "2", "--world-size", "2", "--local-world-size", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["virtual_workers"] == [[0], [1]] and out["speeds"] == [1.0, 1.0]
    with pytest.raises(SystemExit) as e:
        main([str(conf), "--workers", "2", "--world-size", "2", "--local-world-size", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --local-world-size" in err and "Traceback" not in err
