"""``neo calibrate``: measure this machine's cost constants with Neo's own kernels and collectives.

    neo calibrate [--out PATH] [--quick]                                   # one process
    torchrun --standalone --nproc-per-node 2 -m neo.calibrate [--out PATH]  # at 2 ranks on this host

Measures (:mod:`neo.calibrate.measure`) fused lookups and fused backward + optimizer over table
sizes, dims and pooling factors, a cached table's admissions and row moves, the AlltoAll of the
transport training uses and the dense gradients' AllReduce over message sizes, MLP layers, the
dot interaction and the dense optimizer, and two small models (narrow and wide) trained by the
real trainer; fits :class:`neo.planner.CostConstants` to them (:mod:`neo.calibrate.fit`), and
writes one JSON: ``{"format", "machine", "date", "constants": {"<world size>": {...}}, "fit":
{...}, "measurements": {...}}``. A run at another world size adds
its constants to the same file. Default path: this machine's calibration file in the user's cache
directory (``neo.planner.constants.calibration_path``), which ``neo plan`` and ``neo train`` then
use; ``--out`` to choose another (then name it in ``sharding.cost_constants``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["main", "fit_constants", "kind_overheads", "machinery_overheads", "loading_constants", "cache_constants"]


def _mean_records(per_rank: List[List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Records of every rank averaged field by field (the ranks measured the same things)."""
    out = []
    for recs in zip(*per_rank):
        r = dict(recs[0])
        r["seconds"] = float(np.mean([x["seconds"] for x in recs]))
        out.append(r)
    return out


def kind_overheads(meas: Dict[str, Any], c, world_size: int, cores: int = 0) -> Dict[str, float]:
    """Each sharding kind's overhead over table-wise per bag of the global batch (seconds): the
    small model's step with every table of that kind minus with every table table-wise, less the
    difference the rest of the model predicts (on a host of ``cores`` cores), over the bags of
    the step."""
    from neo.calibrate.measure import KIND_BATCH, KIND_TABLES_PER_RANK, machinery_config
    from neo.planner import Plan
    from neo.planner.constants import KIND_OVERHEADS
    from neo.planner.step_model import predict_step

    kinds = dict(meas.get("kinds") or {})
    base = kinds.pop("table_wise", None)
    if not kinds or not base:
        return {}
    c0 = replace(c, **{f: 0.0 for f in KIND_OVERHEADS.values()})

    def predicted_ms(kind: str, plan: Dict[str, Any]) -> float:
        cfg = machinery_config(world_size, kind, per_rank=KIND_TABLES_PER_RANK, batch=KIND_BATCH)
        topo = replace(cfg.topology.to_topology(world_size, world_size), batch_size_per_rank=cfg.train.batch_size)
        return predict_step(Plan.from_dict(plan), cfg.table_specs(), cfg.dense_spec(4), topo, c0, cores=cores,
                            threads_per_rank=int(meas.get("threads") or 1)).step_ms

    # paired by round (a shared machine's load drifts between rounds more than within one)
    tw = np.array(base["rounds_ms"]) - predicted_ms("table_wise", base["plan"])
    bags = KIND_BATCH * world_size * len(base["plan"]["tables"])     # one feature a table
    return {KIND_OVERHEADS[k]: max(0.0, float(np.median(np.array(v["rounds_ms"]) - predicted_ms(k, v["plan"]) - tw)))
            / 1e3 / bags for k, v in kinds.items()}


def _t(foot: float, hot: float, cold: float) -> float:
    return float(np.clip(np.log(max(foot, 1.0) / hot) / np.log(cold / hot), 0.0, 1.0))


def _rank_components(runs: List[Dict[str, Any]]) -> Dict[str, float]:
    """One small model's components from its ranks' measurements."""
    comps: Dict[str, float] = {}
    if runs:
        for k in runs[0]["components_ms"]:
            vals = [r["components_ms"][k] for r in runs]
            # a rank that waits for a slower one does it inside a collective: the collectives'
            # own cost is what the least-waiting rank sees there; the rest is averaged
            comps[k] = float(min(vals) if k in ("input_dist", "output_dist") else np.mean(vals))
    return comps


def lookup_constants(records: List[Dict[str, float]], hot: float, cold: float):
    """The lookup and update constants fitted to :func:`neo.calibrate.measure.lookups`' records
    (caches of ``hot`` and ``cold`` bytes), and the fits' median relative errors."""
    from neo.calibrate.fit import fit_linear

    quality: Dict[str, float] = {}
    rows = []
    for r in records:
        t = _t(r["footprint"], hot, cold)
        if r["phase"] == "fwd":
            rows.append(dict(r, call=1.0, bytes_hot=r["ids"] * r["row_bytes"] * (1 - t),
                             bytes_cold=r["ids"] * r["row_bytes"] * t))
    fwd, quality["lookup_fwd"] = fit_linear(rows, ["call", "bags", "ids", "bytes_hot", "bytes_cold"],
                                            floor={"bags": 1e-12, "ids": 1e-12, "bytes_hot": 1e-13,
                                                   "bytes_cold": 1e-13})
    rows = []
    for r in records:
        t = _t(r["footprint"], hot, cold)
        if r["phase"] == "bwd":
            moved = 2.0 * r["distinct"] * (r["row_bytes"] + r["state_bytes"])
            rows.append(dict(r, call=1.0, bytes_hot=moved * (1 - t), bytes_cold=moved * t))
    bwd, quality["update"] = fit_linear(rows, ["call", "ids", "distinct", "bytes_hot", "bytes_cold"],
                                        floor={"ids": 1e-12, "distinct": 1e-12, "bytes_hot": 1e-13,
                                               "bytes_cold": 1e-13})
    upd = dict(hot_bytes=hot, cold_bytes=cold,
               lookup_bag_s=fwd["bags"], lookup_id_s=fwd["ids"], lookup_bw_hot=1 / fwd["bytes_hot"],
               lookup_bw_cold=1 / max(fwd["bytes_cold"], fwd["bytes_hot"]),
               update_id_s=bwd["ids"], update_row_s=bwd["distinct"], update_bw_hot=1 / bwd["bytes_hot"],
               update_bw_cold=1 / max(bwd["bytes_cold"], bwd["bytes_hot"]),
               lookup_call_s=max(fwd["call"] + bwd["call"], 1e-7))
    return upd, quality


def fit_constants(meas: Dict[str, Any], machine: Dict[str, Any], world_size: int):
    """(CostConstants, fit quality per group) from the measurements of one world size."""
    from neo.calibrate.fit import fit_linear
    from neo.planner.constants import builtin_constants

    base = builtin_constants(machine.get("device_kind", "cpu"))
    hot = float(machine.get("l2_bytes") or 1 << 20)
    # cold: the largest table measured (every bandwidth between is log-linear in the footprint)
    cold = float(max(4 * (machine.get("l3_bytes") or 32 << 20), 8 * hot,
                     max((r["footprint"] for r in meas["lookups"]), default=0)))
    upd, quality = lookup_constants(meas["lookups"], hot, cold)
    upd.update(device_kind=base.device_kind, world_size=world_size, kernel_overhead=base.kernel_overhead)
    for op, lat, bw in (("alltoall", "intra_latency", "intra_bw"), ("allreduce", "allreduce_latency", "allreduce_bw")):
        rows = [dict(r, one=1.0) for r in meas["collectives"] if r["op"] == op]
        if rows:
            f, quality[op] = fit_linear(rows, ["one", "bytes"], floor={"one": 1e-7, "bytes": 1e-13})
            upd[lat], upd[bw] = f["one"], 1 / f["bytes"]
    rows = [r for r in meas["dense"] if r["kind"] in ("mlp", "interaction")]
    d, quality["dense"] = fit_linear([dict(r, layers=r["layers"] or 1, elems=r.get("elems", 0.0)) for r in rows],
                                     ["layers", "flops", "interaction_flops", "elems"],
                                     floor={"layers": 1e-7, "flops": 1e-14, "interaction_flops": 1e-14, "elems": 0.0})
    upd.update(dense_layer_s=d["layers"], dense_flops=1 / d["flops"], interaction_flops=1 / d["interaction_flops"],
               dense_elem_s=d["elems"],
               dense_optimizer_bw=float(np.median([r["bytes"] / r["seconds"] for r in meas["dense"]
                                                   if r["kind"] == "optimizer"])))
    c = replace(base, **upd)
    c = replace(c, **machinery_overheads(meas, c, world_size, int(machine.get("cores") or 0)),
                **loading_constants(meas), **cache_constants(meas, c.host_bw), **weighted_constants(meas))
    c = replace(c, **kind_overheads(meas, c, world_size, int(machine.get("cores") or 0)))
    return c, quality


def machinery_overheads(meas: Dict[str, Any], c, world_size: int, cores: int = 0) -> Dict[str, float]:
    """The per-step costs no kernel shows: the small models' measured components (``machinery``,
    and ``machinery_wide`` if measured) minus what the model with ``c`` explains. The dense part's
    residual grows from the narrow model to the wide one with the pooled elements the dense part
    takes in: that growth per element is ``pooled_elem_s``; the rest is ``step_overhead``.

    With more rank threads than ``cores`` the ranks took turns on the cores, and the trainer's
    computing components (lookups, dense, the rest of the step) hold that sharing, which the step
    model adds itself (``cpu_bound_step``'s stretch): they are scaled by cores / threads first, so
    the constants are a rank's on cores of its own, as the kernels' are (``timed(cpu=True)``).
    The collectives' components are kept as measured (the model does not stretch them)."""
    from neo.calibrate.measure import WIDE_BATCH, WIDE_DIM, WIDE_TABLES_PER_RANK
    from neo.planner.cost import seconds_per_byte
    from neo.planner.step_model import COMPUTING, DenseSpec, dense_seconds

    m = ((meas.get("machinery") or {}).get("measured") or {}).get("components_ms")
    if not m:
        return {}
    c = replace(c, pooled_elem_s=0.0)
    busy_threads = world_size * int(meas.get("threads") or 1)
    share = min(1.0, cores / busy_threads) if cores > 0 else 1.0

    def own_cores(comps: Dict[str, float]) -> Dict[str, float]:
        return {k: v * share if k in COMPUTING else v for k, v in comps.items()}

    m = own_cores(m)

    def residual(comps: Dict[str, float], per_rank: int, dim: int, batch: int) -> Tuple[float, float]:
        """(seconds of the trainer's dense part the dense model does not explain, pooled elements)."""
        spec = DenseSpec(4, (dim,), (1,), num_features=world_size * per_rank, dim=dim, optimizer_state_floats=0)
        return comps["dense"] / 1e3 - dense_seconds(spec, batch, world_size, c), batch * spec.num_features * dim

    res, pooled = residual(m, 1, 16, 256)
    per_elem = 0.0
    wide = ((meas.get("machinery_wide") or {}).get("measured") or {}).get("components_ms")
    if wide:
        wide = own_cores(wide)
        res_w, pooled_w = residual(wide, WIDE_TABLES_PER_RANK, WIDE_DIM, WIDE_BATCH)
        per_elem = max(0.0, (res_w - res) / (pooled_w - pooled))
    lat = c.intra_latency if world_size > 1 else 0.0
    ids_b = 256 * world_size * 4.0 * (world_size - 1) / world_size
    kernel = (256 * world_size) * (c.lookup_bag_s + c.lookup_id_s + 64 * seconds_per_byte(
        np.array([1000 * 128.0]), c.lookup_bw_hot, c.lookup_bw_cold, c)[0])
    return dict(input_dist_overhead=max(1e-6, m["input_dist"] / 1e3 - 2 * lat - ids_b / c.intra_bw),
                output_dist_overhead=max(1e-6, m["output_dist"] / 1e3 - 2 * lat),
                lookup_call_s=max(1e-6, (m["embedding_fwd"] + m["embedding_bwd"]) / 1e3 - 2 * kernel),
                pooled_elem_s=per_elem,
                step_overhead=max(1e-6, (m["other"] + m["data"]) / 1e3 + max(0.0, res - pooled * per_elem)))


def loading_constants(meas: Dict[str, Any]) -> Dict[str, float]:
    """The loader's cost per batch, per bag and per id (``data_batch_s``, ``data_bag_s``,
    ``data_id_s``) fitted to :func:`neo.calibrate.measure.loading`'s records."""
    from neo.calibrate.fit import fit_linear

    rows = meas.get("loading") or []
    if not rows:
        return {}
    f, _ = fit_linear(rows, ["batches", "bags", "ids"])
    return {"data_batch_s": f["batches"], "data_bag_s": f["bags"], "data_id_s": f["ids"]}


def weighted_constants(meas: Dict[str, Any]) -> Dict[str, float]:
    """Learnable per-id weights' cost per call, per feature, per bag and per id
    (``weighted_call_s``, ``weighted_feature_s``, ``weighted_bag_s``, ``weighted_id_s``) fitted to
    :func:`neo.calibrate.measure.weighted_lookups`' records (the lookups' time with the weights
    minus without); none where not measured (records without ``features``: one each)."""
    from neo.calibrate.fit import fit_linear

    rows = [dict(r, call=1.0, features=r.get("features", 1)) for r in meas.get("weighted") or []
            if r["seconds"] > 0]                                                      # 0: lost in the noise
    if not rows:
        return {}
    terms = ["call", "features", "bags", "ids"]
    f, _ = fit_linear(rows, terms, floor={t: 0.0 for t in terms})
    return {"weighted_call_s": f["call"], "weighted_feature_s": f["features"], "weighted_bag_s": f["bags"],
            "weighted_id_s": f["ids"]}


def cache_constants(meas: Dict[str, Any], host_bw: float) -> Dict[str, float]:
    """A cached table's work per step (``cache_batch_s``, ``cache_access_s``,
    ``cache_miss_latency``) fitted to :func:`neo.calibrate.measure.cache`'s records: the seconds
    beyond each miss's two row moves at ``host_bw`` (the model of :mod:`neo.planner.cost`). The
    miss latency at least 1 ns: the cost model takes only a positive one, and where the misses'
    time hides in the noise (a loaded machine) the fit alone can give 0 (the test suite at seed
    shift 563, 2026-12-07: a constants file ``neo plan`` refused)."""
    from neo.calibrate.fit import fit_linear

    rows = meas.get("cache") or []
    if not rows:
        return {}
    net = [dict(r, net=max(r["seconds"] - r["misses"] * 2.0 * r["row_bytes"] / host_bw, 1e-9)) for r in rows]
    f, _ = fit_linear(net, ["batches", "accesses", "misses"], target="net", floor={"misses": 1e-9})
    return {"cache_batch_s": f["batches"], "cache_access_s": f["accesses"], "cache_miss_latency": f["misses"]}


def _machine() -> Dict[str, Any]:
    from neo.machine import machine_info

    from neo.cpp import cache_size_bytes, cpu_caches

    m = machine_info()
    caches = cpu_caches()
    m["l2_bytes"], m["l3_bytes"] = (cache_size_bytes(caches.get(level)) for level in ("L2", "L3"))
    return m


def _init():
    import torch.distributed as dist

    from neo.distributed import ProcessGroups

    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "MASTER_ADDR" in os.environ:
            dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return ProcessGroups.build(int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())))


def _write_json(doc: Dict[str, Any], path: str) -> None:
    """``doc`` to ``path`` atomically (a temporary file renamed over it); the temporary file is
    never left behind."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=float)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.unlink(tmp)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="neo calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON to write (default: this machine's calibration file)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (about a minute)")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    from neo.calibrate import measure
    from neo.commands.arg_types import output_problem
    from neo.planner.constants import FORMAT, calibration_path

    machine = _machine()
    path = args.out or calibration_path(machine)
    why = output_problem(path, make_dirs=True)      # before minutes of measuring, on every rank
    if why:
        print(f"neo calibrate: error: {'--out ' if args.out else 'calibration file '}{path}: {why}", file=sys.stderr)
        return 2
    pg = _init()
    W, rank = pg.world_size, pg.rank
    t0 = time.perf_counter()
    evict = 2 * (machine.get("l3_bytes") or 32 << 20)     # each call finds the caches cold, as in training
    largest = measure.largest_footprint(machine.get("ram_bytes") or 0, pg.local_world_size)
    mine = {"lookups": measure.lookups(pg.world if W > 1 else None, args.quick, evict_bytes=evict,
                                       largest=largest),
            "collectives": measure.collectives(pg, args.quick),
            "dense": measure.dense(pg.world if W > 1 else None, args.quick),
            "threads": torch.get_num_threads()}
    mine["machinery"] = measure.machinery(pg, args.quick)
    mine["machinery_wide"] = measure.machinery(pg, args.quick, per_rank=measure.WIDE_TABLES_PER_RANK,
                                               batch=measure.WIDE_BATCH, dim=measure.WIDE_DIM,
                                               ids_per_bag=measure.WIDE_IDS_PER_BAG)
    mine["weighted"] = measure.weighted_lookups(pg.world if W > 1 else None, args.quick)
    mine["loading"] = measure.loading(pg, args.quick)
    mine["cache"] = measure.cache(pg.world if W > 1 else None, args.quick)
    mine["kinds"] = {}
    for _ in range(1 if args.quick else 3):       # interleaved rounds: a shared machine's load drifts
        for k in (("table_wise",) + measure.KINDS) if W > 1 else ():
            run = measure.machinery(pg, args.quick, kind=k, per_rank=measure.KIND_TABLES_PER_RANK,
                                      batch=measure.KIND_BATCH)
            mine["kinds"].setdefault(k, {"plan": run["plan"], "steps_ms": []})["steps_ms"].append(
                run["measured"].get("median_step_ms"))
    gathered: List[Any] = [None] * W
    if W > 1:
        dist.all_gather_object(gathered, mine, group=pg.world)
    else:
        gathered = [mine]
    if rank == 0:
        meas = {k: _mean_records([g[k] for g in gathered])
                for k in ("lookups", "collectives", "dense", "loading", "cache", "weighted")}
        for key in ("machinery", "machinery_wide"):
            runs = [g[key]["measured"] for g in gathered if g[key].get("measured")]
            meas[key] = {"measured": {"components_ms": _rank_components(runs)}, "per_rank": runs}
        # each kind's step in each round, the mean of the ranks
        meas["kinds"] = {k: {"rounds_ms": [float(np.mean(x)) for x in zip(*[g["kinds"][k]["steps_ms"]
                                                                            for g in gathered])],
                             "plan": v["plan"]} for k, v in mine["kinds"].items()}
        meas["threads"] = mine["threads"]
        c, quality = fit_constants(meas, machine, W)
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        c = replace(c, source=f"neo calibrate on {machine['cpu_model']} ({machine['cpu_isa']}, {machine['cores']} cores"
                              f"{', ' + machine['gpu'] if machine.get('gpu') else ''}), {W} rank(s) x "
                              f"{mine['threads']} thread(s), {date}")
        doc: Dict[str, Any] = {}
        if os.path.exists(path):
            try:
                with open(path) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = {}
            if doc.get("format") != FORMAT or doc.get("machine", {}).get("cpu_model") != machine["cpu_model"]:
                doc = {}
        doc.update(format=FORMAT, machine=machine, date=date)
        doc.setdefault("constants", {})[str(W)] = c.to_dict()
        doc.setdefault("fit", {})[str(W)] = {k: round(v, 4) for k, v in quality.items()}
        doc.setdefault("measurements", {})[str(W)] = meas
        try:
            _write_json(doc, path)
        except OSError as e:                  # changed since the check (a full disk, a directory made there)
            print(f"neo calibrate: error: {'--out ' if args.out else 'calibration file '}{path}: "
                  f"{e.strerror or e}", file=sys.stderr)
            if W > 1:
                dist.barrier(group=pg.world)
            return 2
        print(json.dumps({"path": path, "world_size": W, "seconds": round(time.perf_counter() - t0, 1),
                          "fit_median_relative_error": doc["fit"][str(W)],
                          "constants": {k: v for k, v in c.to_dict().items() if k not in ("source",)}}))
    if W > 1:
        dist.barrier(group=pg.world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
