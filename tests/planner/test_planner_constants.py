"""Which cost constants the planner uses: a named file, this machine's calibration, the built-in
defaults of the device kind; bad files give warnings or errors that name the problem."""

from __future__ import annotations

import json

import pytest

from neo.planner.constants import (FORMAT, CostConstants, builtin_constants, calibration_path, load_constants,
                                   resolve_constants)
from neo.planner.types import PlanningError

CPU = {"device_kind": "cpu", "cpu_model": "Test CPU 9000", "cores": 2, "gpu": None}


def write_calibration(path, per_world, machine=CPU, fmt=FORMAT):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": fmt, "machine": machine,
                                "constants": {str(w): dict(device_kind=machine["device_kind"], world_size=w, **c)
                                              for w, c in per_world.items()}}))


def test_builtin_defaults_name_their_source():
    for kind in ("cpu", "h100", "h200"):
        c = builtin_constants(kind)
        assert c.device_kind == kind and "built-in" in c.source
    assert builtin_constants("h200").lookup_bw_cold > builtin_constants("h100").lookup_bw_cold
    assert builtin_constants("cpu").lookup_bw_cold < builtin_constants("h100").lookup_bw_cold / 100


def test_resolution_order(tmp_path):
    c, what = resolve_constants(None, CPU, 2, cache_dir=str(tmp_path))           # nothing calibrated yet
    assert c == builtin_constants("cpu") and what.startswith("built-in cpu defaults")
    write_calibration(tmp_path / calibration_path(CPU, "x").split("/")[-1],
                      {1: {"update_id_s": 1e-8, "source": "calib w1"}, 2: {"update_id_s": 2e-8, "source": "calib w2"}})
    c2, what2 = resolve_constants(None, CPU, 2, cache_dir=str(tmp_path))
    assert c2.update_id_s == 2e-8 and what2.startswith("calibrated on this machine (calib w2")
    with pytest.warns(UserWarning, match="no constants measured at 4 ranks; using those of 2"):
        assert resolve_constants(None, CPU, 4, cache_dir=str(tmp_path))[0].update_id_s == 2e-8
    explicit = tmp_path / "mine.json"
    explicit.write_text(json.dumps({"device_kind": "cpu", "update_id_s": 5e-8}))
    c3, what3 = resolve_constants(str(explicit), CPU, 2, cache_dir=str(tmp_path))
    assert c3.update_id_s == 5e-8 and what3 == f"file {explicit}"


def test_calibration_of_another_kind_or_format_warns_and_uses_the_defaults(tmp_path):
    path = tmp_path / calibration_path(CPU, "x").split("/")[-1]
    write_calibration(path, {1: {}}, machine=dict(CPU, device_kind="h100"))
    with pytest.warns(UserWarning, match="constants of a h100 machine, this one is cpu.*built-in cpu defaults"):
        c, _ = resolve_constants(None, CPU, 1, cache_dir=str(tmp_path))
    assert c == builtin_constants("cpu")
    write_calibration(path, {1: {}}, fmt=1)
    with pytest.warns(UserWarning, match="calibration format 1 is older than 2"):
        assert resolve_constants(None, CPU, 1, cache_dir=str(tmp_path))[0] == builtin_constants("cpu")
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="not used"):
        assert resolve_constants(None, CPU, 1, cache_dir=str(tmp_path))[0] == builtin_constants("cpu")


def test_bad_constants_are_refused_by_name(tmp_path):
    p = tmp_path / "c.json"
    write_calibration(p, {1: {"intra_bw": 0}})
    with pytest.raises(PlanningError, match="cost constant intra_bw: must be > 0, got 0"):
        load_constants(str(p), 1)
    with pytest.raises(PlanningError, match="cost constants: hot_bytes"):
        CostConstants(hot_bytes=1e9, cold_bytes=1e6)
    with pytest.raises(PlanningError, match="device_kind 'tpu'"):
        CostConstants(device_kind="tpu")
