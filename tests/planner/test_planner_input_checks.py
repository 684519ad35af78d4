"""Bad input to the planner API, the topology section and ``neo calibrate --out`` is refused up
front with an error naming the table, field or option, never a deep traceback or a wrong plan."""

import math
import os
import re

import pytest

from neo.cli import main
from neo.config import ConfigError, load_config
from neo.planner import Device, PlanningError, TableConstraints, TableSpec, Topology, plan_tables

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "configs", "plan_example.yaml")


def test_plan_tables_takes_a_generator_of_tables():
    topo = Topology.uniform(2, 2)
    specs = [TableSpec("a", 1000, 16), TableSpec("b", 2000, 16)]
    from_list = plan_tables(specs, topo).to_dict()
    from_gen = plan_tables((s for s in specs), topo).to_dict()
    assert sorted(from_gen["tables"]) == ["a", "b"] and from_gen["tables"] == from_list["tables"]


@pytest.mark.parametrize("field, value, message", [
    ("pooling_factor", -3, "pooling_factor must be a finite number > 0, got -3"),
    ("pooling_factor", math.nan, "pooling_factor must be a finite number > 0, got nan"),
    ("pooling_factor", math.inf, "pooling_factor must be a finite number > 0, got inf"),
    ("weight_bytes", 0, "weight_bytes must be an integer >= 1, got 0"),
    ("weight_bytes", -4, "weight_bytes must be an integer >= 1, got -4"),
    ("state_floats_per_row", -100, "state_floats_per_row must be an integer >= 0, got -100"),
    ("num_features", 0, "num_features must be an integer >= 1, got 0"),
    ("num_features", -1, "num_features must be an integer >= 1, got -1"),
    ("access_skew", math.nan, "access_skew must be a finite number >= 0, got nan"),
    ("access_skew", -2.0, "access_skew must be a finite number >= 0, got -2.0"),
    ("cache_fraction", 2.0, "cache_fraction must be a number in (0, 1]"),
    ("cache_fraction", 0.0, "cache_fraction must be a number in (0, 1]"),
    ("cache_fraction", math.nan, "cache_fraction must be a number in (0, 1]"),
    ("rows", 1000.5, "rows must be an integer, got 1000.5"),
    ("rows", "1000", "rows must be an integer, got '1000'"),
    ("dim", 16.0, "dim must be an integer, got 16.0"),
    ("distinct_per_batch", -1.0, "distinct_per_batch must be a finite number >= 0"),
    ("hit_curve", ((0.1, 1.5),), "hit_curve must be (cache share, hit rate) pairs, both in [0, 1]"),
])
def test_table_spec_refuses_bad_fields_naming_table_and_field(field, value, message):
    kw = dict(name="t", rows=1000, dim=16)
    kw[field] = value
    with pytest.raises(PlanningError) as e:
        TableSpec(**kw)
    assert str(e.value).startswith("table 't': ") and message in str(e.value)


def test_table_spec_keeps_valid_values_and_none_cache_fraction():
    import numpy as np

    t = TableSpec("t", np.int64(1000), 16, cache_fraction=1, pooling_factor=np.float32(2.5))
    assert t.rows == 1000 and type(t.rows) is int and t.cache_fraction == 1.0 and t.pooling_factor == 2.5
    assert TableSpec("u", 1000, 16).cache_fraction is None      # None: the planner sizes the cache


@pytest.mark.parametrize("build, message", [
    (lambda: Device(speed=math.nan), "device: speed must be a finite number > 0, got nan"),
    (lambda: Device(speed=math.inf), "device: speed must be a finite number > 0, got inf"),
    (lambda: Device(speed=0.0), "device: speed must be a finite number > 0, got 0.0"),
    (lambda: Device(hbm_bytes=-1), "device: hbm_bytes must be an integer >= 0, got -1"),
    (lambda: Topology.uniform(2, 2, hbm_gib=math.nan), "topology: hbm_gib must be a finite number > 0"),
    (lambda: Topology.uniform(2, 2, hbm_gib=-1.0), "topology: hbm_gib must be a finite number > 0"),
    (lambda: Topology.uniform(2, 2, host_gib=math.inf), "topology: host_gib must be a finite number >= 0"),
    (lambda: Topology.uniform(2, 2, speed=math.nan), "device: speed must be a finite number > 0, got nan"),
    (lambda: Topology(2, 2, batch_size_per_rank=0.5), "topology: batch_size_per_rank must be an integer, got 0.5"),
])
def test_devices_and_topologies_refuse_non_finite_values(build, message):
    with pytest.raises(PlanningError, match=None) as e:
        build()
    assert message in str(e.value)


def test_plan_tables_checks_its_arguments():
    topo, t = Topology.uniform(2, 2), [TableSpec("a", 1000, 16)]
    with pytest.raises(PlanningError, match=r"partitioners: none given"):
        plan_tables(t, topo, partitioners=())
    with pytest.raises(PlanningError, match=r"alternatives must be an integer >= 0, got -1"):
        plan_tables(t, topo, alternatives=-1)
    with pytest.raises(PlanningError, match=r"tables\[1\]: expected a TableSpec"):
        plan_tables(t + [("b", 10, 4)], topo)
    assert plan_tables(t, topo, partitioners="greedy").summary["partitioner"] == "greedy"


@pytest.mark.parametrize("override, message", [
    ("topology.imbalance_weight=.inf", "topology.imbalance_weight: must be >= 0 and finite, or null, got inf"),
    ("topology.hbm_bandwidth_gbps=.inf", "topology.hbm_bandwidth_gbps: must be > 0 and finite, or null, got inf"),
    ("topology.inter_node_bandwidth_gbps=.inf", "topology.inter_node_bandwidth_gbps: must be > 0 and finite"),
    ("topology.intra_node_latency_us=.inf", "topology.intra_node_latency_us: must be > 0 and finite"),
    ("topology.host_bandwidth_gbps=1e308", "topology.host_bandwidth_gbps: 1e+308 is too large"),
])
def test_topology_refuses_infinite_values_naming_the_field(override, message, capsys):
    if "1e308" not in override:
        with pytest.raises(ConfigError, match=None) as e:
            load_config(EXAMPLE, [override])
        assert message in str(e.value)
    assert main(["plan", EXAMPLE, "--world-size", "8", "--local-world-size", "4", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("neo plan: error: ") and message in err and err.count("\n") == 1


def test_neo_calibrate_checks_out_before_measuring_and_leaves_no_temp_file(tmp_path, capsys):
    import time

    t0 = time.perf_counter()
    assert main(["calibrate", "--quick", "--out", str(tmp_path)]) == 2
    assert f"neo calibrate: error: --out {tmp_path}: is a directory" in capsys.readouterr().err
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert main(["calibrate", "--quick", "--out", str(a_file / "sub" / "c.json")]) == 2
    assert f"{a_file} is not a directory" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 10          # no measuring first
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_calibration_write_never_leaves_its_temp_file(tmp_path):
    from neo.calibrate import _write_json

    target = tmp_path / "c.json"
    target.mkdir()                                  # a directory made there after the check
    with pytest.raises(OSError):
        _write_json({"a": 1}, str(target))
    assert os.listdir(tmp_path) == ["c.json"]
    _write_json({"a": 1}, str(tmp_path / "ok.json"))
    assert sorted(os.listdir(tmp_path)) == ["c.json", "ok.json"]


def test_a_table_whose_bytes_overflow_is_named_without_inf():
    """A finite but absurd pooling factor (the planner API takes any finite one; the config bounds
    it) makes every shard's bytes overflow: the error says so and names the statistics, not
    'needs inf bytes'."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)            # numpy's, from the overflowing costs
        with pytest.raises(PlanningError) as e:
            plan_tables([TableSpec("big", 100, 8, pooling_factor=1e308)], Topology.uniform(2, 2))
    msg = str(e.value)
    assert msg.startswith("table 'big' cannot be placed: ") and "pooling_factor 1e+308" in msg
    assert "overflow" in msg and not re.search(r"\b(inf|nan)\b", msg)


def test_a_table_too_large_names_the_memory_that_is_short():
    """Host memory short (a cached table's rows live there) is named as host memory and
    topology.host_gib, with the bytes needed there; device memory short as device memory and
    topology.hbm_gib (before, the host shortfall was printed beside the device bytes)."""
    with pytest.raises(PlanningError) as e:
        plan_tables([TableSpec("big", 10**9, 64, constraints=TableConstraints(placement="cached"))],
                    Topology.uniform(2, 2, hbm_gib=8, host_gib=16))
    host = re.search(r"needs (\d+) bytes \(\S+ GiB\) of host memory \(topology\.host_gib\) on one rank; "
                     r"(\d+) bytes \(\S+ GiB\) missing", str(e.value))
    assert host, str(e.value)
    assert int(host.group(1)) - int(host.group(2)) == 16 * 2**30          # need - missing = the rank's host memory
    with pytest.raises(PlanningError) as e:
        plan_tables([TableSpec("big", 10**8, 64, constraints=TableConstraints(placement="device"))],
                    Topology.uniform(2, 2, hbm_gib=8))
    dev = re.search(r"needs (\d+) bytes \(\S+ GiB\) of device memory \(topology\.hbm_gib\) on one rank; "
                    r"(\d+) bytes \(\S+ GiB\) missing", str(e.value))
    assert dev, str(e.value)
