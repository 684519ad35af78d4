"""Which cost constants the planner uses: a named file, this machine's calibration, the built-in
defaults of the device kind; bad files give warnings or errors that name the problem."""

from __future__ import annotations

import json
import re
from dataclasses import replace as replace_

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
    # a CPU's random-row gathers (about 40 GB/s on the 2-core Zen 5 VM) far below an H100's HBM
    assert builtin_constants("cpu").lookup_bw_cold < builtin_constants("h100").lookup_bw_cold / 20


def test_one_process_on_a_cpu_has_the_one_process_overheads():
    """At world size 1 there are no collectives: a CPU's built-in distribution overheads are the
    one-rank paths', measured in one process, and the rest is the same; GPUs' do not change."""
    many, one = builtin_constants("cpu"), builtin_constants("cpu", 1)
    assert builtin_constants("cpu", 2) == many and builtin_constants("cpu", 8) == many
    assert one.input_dist_overhead < many.input_dist_overhead / 3
    assert one.output_dist_overhead < many.output_dist_overhead / 3
    assert replace_(one, input_dist_overhead=1, output_dist_overhead=1, source="") == replace_(
        many, input_dist_overhead=1, output_dist_overhead=1, source="")
    assert "one process" in one.source
    for kind in ("h100", "h200"):
        assert builtin_constants(kind, 1) == builtin_constants(kind)
    assert resolve_constants(None, CPU, 1, cache_dir="/nonexistent-neo-cache")[0] == one


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
    assert c == builtin_constants("cpu", 1)
    write_calibration(path, {1: {}}, fmt=1)
    with pytest.warns(UserWarning, match="calibration format 1 is older than 2"):
        assert resolve_constants(None, CPU, 1, cache_dir=str(tmp_path))[0] == builtin_constants("cpu", 1)
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="not used"):
        assert resolve_constants(None, CPU, 1, cache_dir=str(tmp_path))[0] == builtin_constants("cpu", 1)


def test_bad_constants_are_refused_by_name(tmp_path):
    p = tmp_path / "c.json"
    write_calibration(p, {1: {"intra_bw": 0}})
    with pytest.raises(PlanningError, match="cost constant intra_bw: must be > 0, got 0"):
        load_constants(str(p), 1)
    with pytest.raises(PlanningError, match="cost constants: hot_bytes"):
        CostConstants(hot_bytes=1e9, cold_bytes=1e6)
    with pytest.raises(PlanningError, match="device_kind 'tpu'"):
        CostConstants(device_kind="tpu")
    with pytest.raises(PlanningError, match="cost constant row_wise_overhead: must be >= 0"):
        CostConstants(row_wise_overhead=-1e-9)


def _step(types, c, W=2, B=1024, pf=3.0):
    from dataclasses import replace

    from neo.planner import Topology, plan_tables
    from neo.planner.step_model import DenseSpec, predict_step
    from neo.planner.types import TableConstraints, TableSpec

    tables = [TableSpec(f"t{k}", 1000 * (k + 1), 16, pooling_factor=pf, constraints=TableConstraints((st,)))
              for k, st in enumerate(types)]
    topo = replace(Topology.uniform(W, W), batch_size_per_rank=B)
    plan = plan_tables(tables, topo, c)
    return plan, tables, topo, predict_step(plan, tables, DenseSpec(4, (16,), (1,), len(tables), 16), topo, c)


def test_a_kinds_overhead_is_charged_per_bag_of_the_global_batch_on_every_rank():
    from neo.planner import ShardingType as T

    c0 = replace_(builtin_constants("cpu"), row_wise_overhead=0.0, data_parallel_overhead=0.0)
    c1 = replace_(c0, row_wise_overhead=50e-9, data_parallel_overhead=20e-9)
    types = [T.ROW_WISE, T.TABLE_WISE, T.DATA_PARALLEL]
    *_, a = _step(types, c0)
    *_, b = _step(types, c1)
    bags = 2 * 1024                                            # W x B, per table (3 ids a bag: not counted)
    extra = (50e-9 + 20e-9) * bags * 1e3
    assert b.step_ms - a.step_ms == pytest.approx(extra, rel=1e-9)
    assert b.components_ms["output_dist"] - a.components_ms["output_dist"] == pytest.approx(extra, rel=1e-9)
    for r0, r1 in zip(a.rank_ms, b.rank_ms):                 # every rank pays it, wherever the shards are
        assert r1 - r0 == pytest.approx(extra, rel=1e-9)
    *_, one = _step(types, c1, W=1)
    *_, one0 = _step(types, c0, W=1)
    assert one.step_ms == pytest.approx(one0.step_ms, rel=1e-12), "one process: no distribution, no overhead"


def test_calibration_recovers_a_kinds_overhead_from_paired_rounds():
    """neo calibrate's fit of the kind overheads, on measurements made of the model plus known
    overheads and a load that drifts from round to round."""
    from dataclasses import replace

    from neo.calibrate import kind_overheads
    from neo.calibrate.measure import KIND_BATCH, KIND_TABLES_PER_RANK, machinery_config
    from neo.planner import plan_tables
    from neo.planner.step_model import predict_step

    from neo.planner.constants import KIND_OVERHEADS

    # the synthetic steps carry the true overheads alone: the model's own start at 0
    W, c = 2, replace_(builtin_constants("cpu"), **{f: 0.0 for f in KIND_OVERHEADS.values()})
    truth = {"table_wise": 0.0, "row_wise": 80e-9, "column_wise": 0.0, "data_parallel": 30e-9}
    drift = [0.0, 1.7, 0.4]                                   # ms the machine's load adds in each round
    kinds = {}
    for kind, per_bag in truth.items():
        cfg = machinery_config(W, kind, per_rank=KIND_TABLES_PER_RANK, batch=KIND_BATCH)
        topo = replace(cfg.topology.to_topology(W, W), batch_size_per_rank=KIND_BATCH)
        plan = plan_tables(cfg.table_specs(), topo, c)
        ms = predict_step(plan, cfg.table_specs(), cfg.dense_spec(4), topo, c).step_ms + 0.3   # + unexplained
        bags = KIND_BATCH * W * len(cfg.tables)
        kinds[kind] = {"plan": plan.to_dict(), "rounds_ms": [ms + per_bag * bags * 1e3 + d for d in drift]}
    got = kind_overheads({"kinds": kinds}, c, W)
    assert got["row_wise_overhead"] == pytest.approx(80e-9, rel=1e-6)
    assert got["data_parallel_overhead"] == pytest.approx(30e-9, rel=1e-6)
    assert got["column_wise_overhead"] == pytest.approx(0.0, abs=1e-15)
    assert kind_overheads({"kinds": {}}, c, W) == {}


def test_dense_part_charges_each_pooled_element():
    """``pooled_elem_s`` is paid once per element of the B x F x D pooled input of the dense part."""
    from dataclasses import replace

    from neo.planner.step_model import DenseSpec, dense_seconds

    spec = DenseSpec(13, (64, 32), (64, 1), num_features=10, dim=32)
    c0 = replace(builtin_constants("cpu"), pooled_elem_s=0.0)
    c1 = replace(c0, pooled_elem_s=2.5e-9)
    for W in (1, 2):
        extra = dense_seconds(spec, 2048, W, c1) - dense_seconds(spec, 2048, W, c0)
        assert extra == pytest.approx(2048 * 10 * 32 * 2.5e-9, rel=1e-9)


def test_the_dense_allreduce_across_nodes_is_no_faster_than_the_network():
    """One host: the AllReduce's own terms (the trainer's shared-memory hook there). Ranks on two
    hosts: a bucket's latency at least ``inter_latency``, its bytes at no more than ``inter_bw``."""
    from dataclasses import replace

    from neo.planner.step_model import DenseSpec, dense_seconds

    spec = DenseSpec(13, (512, 256), (512, 1), num_features=26, dim=64)      # 1.2 MB of gradients: one bucket
    c = replace(builtin_constants("cpu"), allreduce_latency=10e-6, allreduce_bw=11e9,
                inter_latency=200e-6, inter_bw=1e9)
    grad = spec.params * 4.0
    alone = dense_seconds(spec, 2048, 1, c)
    one_host = dense_seconds(spec, 2048, 4, c, nodes=1)
    two_hosts = dense_seconds(spec, 2048, 4, c, nodes=2)
    assert one_host - alone == pytest.approx(10e-6 + grad * 1.5 / 11e9, rel=1e-9)
    assert two_hosts - alone == pytest.approx(200e-6 + grad * 1.5 / 1e9, rel=1e-9)
    fast_net = replace(c, inter_latency=1e-6, inter_bw=100e9)                # never faster than on one host
    assert dense_seconds(spec, 2048, 4, fast_net, nodes=2) == pytest.approx(one_host, rel=1e-12)


def test_calibration_recovers_the_cost_per_pooled_element():
    """neo calibrate's split of the small models' unexplained dense time into a constant and a
    part per pooled element, on components made of the model plus known costs."""
    from dataclasses import replace

    from neo.calibrate import machinery_overheads
    from neo.calibrate.measure import WIDE_BATCH, WIDE_DIM, WIDE_TABLES_PER_RANK
    from neo.planner.step_model import DenseSpec, dense_seconds

    W, c = 2, replace(builtin_constants("cpu"), pooled_elem_s=7e-9)   # the fit must not count this one
    base = replace(c, pooled_elem_s=0.0)
    per_elem, fixed = 3e-9, 0.4e-3

    def comps(per_rank, dim, batch):
        spec = DenseSpec(4, (dim,), (1,), num_features=W * per_rank, dim=dim, optimizer_state_floats=0)
        dense = dense_seconds(spec, batch, W, base) + fixed + per_elem * batch * W * per_rank * dim
        return {"measured": {"components_ms": {"dense": dense * 1e3, "input_dist": 0.5, "output_dist": 0.6,
                                               "embedding_fwd": 0.2, "embedding_bwd": 0.3, "other": 0.1,
                                               "data": 0.05}}}

    narrow = comps(1, 16, 256)
    got = machinery_overheads({"machinery": narrow, "machinery_wide": comps(WIDE_TABLES_PER_RANK, WIDE_DIM,
                                                                            WIDE_BATCH)}, c, W)
    assert got["pooled_elem_s"] == pytest.approx(per_elem, rel=1e-6)
    assert got["step_overhead"] == pytest.approx(fixed + 0.15e-3, rel=1e-6)
    narrow_only = machinery_overheads({"machinery": narrow}, c, W)
    assert narrow_only["pooled_elem_s"] == 0.0
    assert narrow_only["step_overhead"] == pytest.approx(fixed + 0.15e-3 + per_elem * 256 * W * 16, rel=1e-6)


def test_calibration_recovers_the_loaders_cost_per_batch_bag_and_id():
    from neo.calibrate import loading_constants

    per_batch, per_bag, per_id = 0.3e-3, 150e-9, 4e-9
    rows = [{"batches": 1.0, "bags": b, "ids": i, "seconds": per_batch + b * per_bag + i * per_id}
            for b, i in ((512, 512), (8192, 65536), (16384, 131072))]
    got = loading_constants({"loading": rows})
    assert got["data_batch_s"] == pytest.approx(per_batch, rel=1e-6)
    assert got["data_bag_s"] == pytest.approx(per_bag, rel=1e-6)
    assert got["data_id_s"] == pytest.approx(per_id, rel=1e-6)
    assert loading_constants({}) == {}


def test_calibrations_loading_cases_tell_the_cost_per_id_from_the_cost_per_bag():
    """Timings of ``loading_cases``' batches made by a loader whose work is all per batch and per id
    (as measured on 2026-12-05: 130 us and 13 ns), each 5% off at random: the fitted constants
    must charge a ``zipf_mix`` batch (2048 samples, 10 bags and 169 ids each) within 10%. The
    cases before (no one-hot batch as large as the multi-hot one) missed by up to 52% (a third of
    the draws by more than 15%): bags and ids moved together, and the fit put the ids' cost on
    the bags."""
    import numpy as np

    from neo.calibrate import loading_constants
    from neo.calibrate.measure import loading_cases

    design = [(F * B, F * B * ids_per_bag) for _, F, B, ids_per_bag in loading_cases(2)]
    truth = 130e-6 + 2048 * 169 * 13e-9
    for seed in range(100):
        rng = np.random.default_rng(seed)
        rows = [{"batches": 1.0, "bags": bags, "ids": ids,
                 "seconds": (130e-6 + ids * 13e-9) * (1 + rng.uniform(-0.05, 0.05))} for bags, ids in design]
        got = loading_constants({"loading": rows})
        charged = got["data_batch_s"] + 2048 * (10 * got["data_bag_s"] + 169 * got["data_id_s"])
        assert charged == pytest.approx(truth, rel=0.10), seed


def test_the_loaders_work_per_batch_bag_and_id():
    from dataclasses import replace

    from neo.planner.step_model import data_seconds
    from neo.planner.types import TableSpec

    c = replace(builtin_constants("cpu"), data_batch_s=1e-4, data_bag_s=1e-7, data_id_s=2e-9)
    tables = [TableSpec("a", 100, 16, pooling_factor=3.0), TableSpec("b", 100, 16, num_features=2, pooling_factor=5.0)]
    assert data_seconds(tables, 1000, c) == pytest.approx(1e-4 + 1000 * (3 * 1e-7 + 13 * 2e-9), rel=1e-12)


@pytest.mark.parametrize("quick,largest", [(False, 0), (True, 0), (False, 2 << 30)])
def test_calibration_tells_the_cost_per_bag_from_the_cost_per_call(quick, largest):
    """neo calibrate's lookup records (:func:`lookup_cases`: batches of two sizes) made of known
    costs per call, bag, id, row and byte: the fit recovers each of them, where with one batch
    size the cost per bag would be a cost per call."""
    from neo.calibrate import _t, lookup_constants
    from neo.calibrate.measure import lookup_cases, lookup_rows

    hot, cold = float(1 << 20), float(max(128 << 20, largest))
    assert max(c[0] for c in lookup_cases(quick, largest)) == (largest if largest else 384 << 20)
    call_f, bag, idc, bw_hot, bw_cold = 90e-6, 30e-9, 0.5e-9, 100e9, 15e9
    call_b, upd_id, upd_row, ubw_hot, ubw_cold = 120e-6, 6e-9, 25e-9, 40e9, 12e9
    records = []
    for foot, D, P, skewed, B in lookup_cases(quick):
        rows = lookup_rows(foot, D)
        ids = B * P
        distinct = min(rows, ids) // (3 if skewed else 1)
        t = _t(rows * 8 * D, hot, cold)
        row_b = 4 * D
        fwd = call_f + B * bag + ids * idc + ids * row_b * ((1 - t) / bw_hot + t / bw_cold)
        moved = 2.0 * distinct * 2 * row_b
        bwd = call_b + ids * upd_id + distinct * upd_row + moved * ((1 - t) / ubw_hot + t / ubw_cold)
        common = {"bags": B, "ids": ids, "distinct": distinct, "row_bytes": row_b, "state_bytes": row_b,
                  "footprint": rows * 8 * D}
        records += [dict(common, phase="fwd", seconds=fwd), dict(common, phase="bwd", seconds=bwd)]
    got, quality = lookup_constants(records, hot, cold)
    assert quality["lookup_fwd"] < 1e-6 and quality["update"] < 1e-6
    assert got["lookup_bag_s"] == pytest.approx(bag, rel=1e-4)
    assert got["lookup_call_s"] == pytest.approx(call_f + call_b, rel=1e-4)
    assert got["lookup_id_s"] == pytest.approx(idc, rel=1e-3)
    assert got["update_row_s"] == pytest.approx(upd_row, rel=1e-3)
    assert got["update_bw_cold"] == pytest.approx(ubw_cold, rel=1e-3)


def test_the_largest_calibration_table_fits_the_hosts_memory():
    """2 GiB a rank, less where the host's ranks would take more than a sixth of its memory, and
    none below 1 GiB (the fixed sizes end at 384 MiB); quick calibrations leave it out."""
    from neo.calibrate.measure import largest_footprint, lookup_cases

    assert largest_footprint(24 << 30, 1) == 2 << 30
    assert largest_footprint(24 << 30, 4) == 1 << 30
    assert largest_footprint(24 << 30, 8) == 0 and largest_footprint(0, 1) == 0
    assert (2 << 30) not in {c[0] for c in lookup_cases(True, 2 << 30)}


def test_cold_bytes_is_the_largest_table_measured():
    """The cold bandwidths are those of the largest calibration table, wherever it ends."""
    from neo.calibrate import fit_constants

    def meas(largest):
        recs = []
        for foot in (256 << 10, 16 << 20, 384 << 20) + ((largest,) if largest else ()):
            for ids, B in ((2048, 2048), (32768, 2048), (8192, 512), (98304, 2048)):
                common = {"bags": B, "ids": ids, "distinct": ids, "row_bytes": 256, "state_bytes": 256,
                          "footprint": foot}
                t = 1e-4 + ids * 1e-8 * (1 + foot / 1e9)
                recs += [dict(common, phase="fwd", seconds=t), dict(common, phase="bwd", seconds=2 * t)]
        dense = [{"kind": "mlp", "layers": 1, "flops": 1e8 * k, "interaction_flops": 0.0, "bytes": 0,
                  "seconds": 1e-4 + 1e-3 * k} for k in (1, 2, 4)]
        dense += [{"kind": "interaction", "layers": 0, "flops": 0.0, "interaction_flops": 1e7 * k, "bytes": 0,
                   "seconds": 1e-4 + 1e-3 * k} for k in (1, 2)]
        dense += [{"kind": "optimizer", "layers": 0, "flops": 0.0, "interaction_flops": 0.0, "bytes": 1e8,
                   "seconds": 1e-2}]
        return {"lookups": recs, "collectives": [], "dense": dense}

    machine = {"device_kind": "cpu", "l2_bytes": 1 << 20, "l3_bytes": 32 << 20}
    assert fit_constants(meas(0), machine, 1)[0].cold_bytes == 384 << 20
    assert fit_constants(meas(2 << 30), machine, 1)[0].cold_bytes == 2 << 30


def test_the_dense_fit_tells_a_layers_fixed_cost_from_its_work_per_activation_element():
    """Layers timed at two batch sizes as t = 40 us + flops / 50 GF/s + elems x 2 ns: the fit
    recovers each constant, and the step model charges a layer's activations B (in + out) of them."""
    from neo.calibrate import fit_constants
    from neo.planner.step_model import DenseSpec, dense_seconds

    layer_s, flops_rate, elem_s = 40e-6, 50e9, 2e-9
    dense = []
    for B in (2048, 256):
        for i, o in ((13, 64), (64, 16), (512, 256), (64, 1), (1024, 1024)):
            f, e = 6.0 * B * i * o, float(B * (i + o))
            dense.append({"kind": "mlp", "layers": 1, "flops": f, "interaction_flops": 0.0, "elems": e,
                          "seconds": layer_s + f / flops_rate + e * elem_s})
    dense += [{"kind": "interaction", "layers": 0, "flops": 0.0, "interaction_flops": 1e7 * k, "elems": 0.0,
               "seconds": layer_s + 1e7 * k / 20e9} for k in (1, 2, 4)]
    dense += [{"kind": "optimizer", "bytes": 1e8, "seconds": 1e-2}]
    lookups = [{"bags": 2048, "ids": ids, "distinct": ids, "row_bytes": 256, "state_bytes": 256, "footprint": foot,
                "phase": ph, "seconds": 1e-4 + ids * 1e-8}
               for foot in (256 << 10, 384 << 20) for ids in (2048, 32768) for ph in ("fwd", "bwd")]
    c, quality = fit_constants({"lookups": lookups, "collectives": [], "dense": dense},
                               {"device_kind": "cpu", "l2_bytes": 1 << 20, "l3_bytes": 32 << 20}, 1)
    assert c.dense_layer_s == pytest.approx(layer_s, rel=1e-3)
    assert c.dense_flops == pytest.approx(flops_rate, rel=1e-3)
    assert c.dense_elem_s == pytest.approx(elem_s, rel=1e-3)
    assert c.interaction_flops == pytest.approx(20e9, rel=1e-3)
    spec = DenseSpec(num_dense=13, bottom=(64, 16), top=(64, 32, 1), num_features=8, dim=16, optimizer_state_floats=0)
    without = dense_seconds(spec, 1024, 1, replace_(c, dense_elem_s=0.0))
    elems = 1024 * ((13 + 64) + (64 + 16) + (52 + 64) + (64 + 32) + (32 + 1))
    assert dense_seconds(spec, 1024, 1, c) - without == pytest.approx(elems * elem_s, rel=1e-9)


def test_calibration_takes_the_sharing_of_cores_out_of_the_small_models_components():
    """At 4 ranks of 1 thread on 2 cores the trainer's computing components (lookups, dense, the
    rest of the step) held each rank's half share of a core: the constants fitted from them are a
    rank's on cores of its own (the step model stretches them itself), and the collectives'
    components are kept as measured. Checked against the same components at half, unshared."""
    from dataclasses import replace

    from neo.calibrate import machinery_overheads

    W, c = 4, replace(builtin_constants("cpu"), pooled_elem_s=0.0)
    own = {"dense": 3.0, "input_dist": 0.5, "output_dist": 0.6, "embedding_fwd": 0.2, "embedding_bwd": 0.3,
           "other": 0.1, "data": 0.05}
    shared = {k: v * (2.0 if k not in ("input_dist", "output_dist") else 1.0) for k, v in own.items()}
    meas = lambda comps, threads: {"machinery": {"measured": {"components_ms": comps}}, "threads": threads}  # noqa: E731
    on_two_cores = machinery_overheads(meas(shared, 1), c, W, cores=2)
    unshared = machinery_overheads(meas(own, 1), c, W, cores=0)
    for k in ("step_overhead", "lookup_call_s", "output_dist_overhead", "input_dist_overhead"):
        assert on_two_cores[k] == pytest.approx(unshared[k], rel=1e-9), k
    # with enough cores (or two threads a rank on eight) nothing is scaled
    assert machinery_overheads(meas(shared, 1), c, W, cores=4) == machinery_overheads(meas(shared, 1), c, W)
    assert machinery_overheads(meas(shared, 2), c, W, cores=8) == machinery_overheads(meas(shared, 1), c, W)


def test_timed_counts_cpu_seconds_for_compute_and_the_wall_clock_otherwise():
    """``timed(cpu=True)``: a call that waits (a sleep: descheduled) costs nothing; a computing one
    costs the CPU seconds it used (30 ms spent, counted by the process's own clock: on a loaded
    machine its wall time is longer)."""
    import time

    import torch

    from neo.calibrate.measure import timed

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert timed(lambda: time.sleep(0.03), 3, warmup=0) >= 0.03
        assert timed(lambda: time.sleep(0.03), 3, warmup=0, cpu=True) < 0.01

        def spin():                   # 30 ms of this process's CPU, however long the machine's load makes it
            t0 = time.process_time()
            while time.process_time() - t0 < 0.03:
                pass
        assert 0.03 <= timed(spin, 3, warmup=0, cpu=True) < 0.04
    finally:
        torch.set_num_threads(prev)


@pytest.mark.parametrize("name, text", [("inter_bw", "Infinity"), ("lookup_id_s", "-Infinity"),
                                        ("dense_flops", "NaN"), ("imbalance_weight", "NaN"),
                                        ("memory_headroom", "Infinity"), ("cold_bytes", "Infinity"),
                                        ("row_wise_overhead", "-1e-9"), ("intra_bw", "-5")])
def test_a_file_of_non_finite_or_negative_constants_is_refused_naming_the_field_and_the_file(tmp_path, name, text):
    """Python's json reads ``Infinity`` and ``NaN``: a constant that is not a finite number >= 0 is
    refused by name, with the file it came from, by every reader of constants files."""
    flat = tmp_path / "flat.json"
    flat.write_text(f'{{"device_kind": "cpu", "{name}": {text}}}')
    calib = tmp_path / "calib.json"
    calib.write_text(f'{{"format": {FORMAT}, "constants": {{"1": {{"device_kind": "cpu", "{name}": {text}}}}}}}')
    field = f"cost constant {name}: must be"
    flat_, calib_ = re.escape(str(flat)), re.escape(str(calib))
    with pytest.raises(PlanningError, match=f"{flat_}: {field}"):
        CostConstants.from_json(str(flat))
    with pytest.raises(PlanningError, match=f"{flat_}: {field}"):
        load_constants(str(flat), 1)
    with pytest.raises(PlanningError, match=rf"{calib_}: constants\[1\]: {field}"):
        load_constants(str(calib), 1)
    with pytest.raises(PlanningError, match=f"cannot use '{flat_}'.*{field}"):
        resolve_constants(str(flat), CPU, 1)
    with pytest.raises(PlanningError, match=f"{field}"):
        CostConstants(**{name: float(text.replace("Infinity", "inf"))})


@pytest.mark.parametrize("name, text", [("lookup_id_s", '"fast"'), ("inter_bw", '"1e9"'), ("id_bytes", "true"),
                                        ("dense_flops", "null"), ("hot_bytes", "[1]")])
def test_a_constant_that_is_not_a_number_is_refused_naming_the_field_and_the_file(tmp_path, name, text):
    """A string (even one that reads as a number), a boolean, null or a list: refused by name, not
    a numpy error inside the cost model."""
    flat = tmp_path / "flat.json"
    flat.write_text(f'{{"device_kind": "cpu", "{name}": {text}}}')
    with pytest.raises(PlanningError, match=f"{re.escape(str(flat))}: cost constant {name}: expected a number, got"):
        CostConstants.from_json(str(flat))
    with pytest.raises(PlanningError, match=f"cannot use '{re.escape(str(flat))}'.*cost constant {name}: expected"):
        resolve_constants(str(flat), CPU, 1)


@pytest.mark.parametrize("fmt", ["Infinity", "NaN", "-Infinity"])
def test_a_non_finite_format_is_refused_naming_the_file(tmp_path, fmt):
    """A format of ``Infinity`` or ``NaN`` is a wrong format, not an overflow out of int()."""
    flat = tmp_path / "flat.json"
    flat.write_text(f'{{"device_kind": "cpu", "format": {fmt}}}')
    calib = tmp_path / "calib.json"
    calib.write_text(f'{{"format": {fmt}, "constants": {{"1": {{"device_kind": "cpu"}}}}}}')
    with pytest.raises(PlanningError, match=f"cannot use '{re.escape(str(flat))}'.*format .* is not {FORMAT}"):
        resolve_constants(str(flat), CPU, 1)
    with pytest.raises(PlanningError, match=f"cannot use '{re.escape(str(calib))}'.*calibration format .* is not"):
        resolve_constants(str(calib), CPU, 1)


def test_the_cache_fit_keeps_a_positive_miss_latency_the_cost_model_accepts():
    """Cache records whose time the batches and accesses explain alone (each miss's two row moves
    at host_bw taken out, nothing left for the misses, as on a loaded machine): the fitted miss
    latency is the 1 ns floor, not 0, and the constants load (``neo plan`` refused a calibration
    with 0 at seed shift 563, 2026-12-07); where the misses do cost, the fit recovers them."""
    from dataclasses import replace

    from neo.calibrate import cache_constants
    from neo.planner.constants import CostConstants

    host_bw, row_bytes = 3e9, 256.0
    design = [(1.0, 4096.0, 1024.0), (1.0, 65536.0, 30000.0), (1.0, 16384.0, 16000.0)]

    def rows(miss_s):
        return [{"batches": b, "accesses": a, "misses": m, "row_bytes": row_bytes,
                 "seconds": 0.3e-3 * b + 0.2e-6 * a + m * (2 * row_bytes / host_bw + miss_s)} for b, a, m in design]

    hidden = cache_constants({"cache": rows(0.0)}, host_bw)
    assert hidden["cache_miss_latency"] == 1e-9
    assert hidden["cache_batch_s"] == pytest.approx(0.3e-3, rel=1e-6)
    replace(CostConstants(), **hidden)                  # validated: a 0 latency raised PlanningError here
    seen = cache_constants({"cache": rows(1.5e-6)}, host_bw)
    assert seen["cache_miss_latency"] == pytest.approx(1.5e-6, rel=1e-6)
