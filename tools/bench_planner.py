#!/usr/bin/env python
"""Benchmark Neo's sharding planner.

    python tools/bench_planner.py [--json out.json] [--quick] [--no-torchrec]

1. Speed: 1,000 production-like tables on 128 ranks (16 nodes x 8), full pipeline
   (enumerate, estimate, propose, partition x3, pick, plan), best of ``--repeat`` runs; and
   ``neo plan`` end to end on a 1,000-table YAML config (a new process: imports, config
   loading and validation, planning, the report), best of ``--repeat`` (target: 3 s).
2. Quality: for several production-like sets (rows log-uniform 10..100M, dims 16..256,
   Pareto-skewed pooling factors, fp16/fp32), the predicted max and max/mean rank time of
   the plan restricted to greedy, Karmarkar-Karp and the refinement, side by side, and,
   where torchrec is importable, TorchRec's ``EmbeddingShardingPlanner`` on the same tables
   (its plan translated into Neo shards and scored by Neo's cost model).
3. Against planners restricted to fewer kinds (``--rival-seeds``): how often, and by how much,
   the planner forced to one sharding kind, or forbidden one, predicts a less busy busiest rank
   than the free planner on the same tables.
4. What skipping proposals by their lower bound costs (``--skip-seeds``): the pick with skipping
   against the pick with every proposal partitioned (``alternatives``), how often they differ,
   by how much, and the time each search takes.

Everything is printed as a markdown table; ``--json FILE`` writes the records.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
import warnings
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_common import json_path, machine_info, nonneg_int, peer_version, positive_int, write_json  # noqa: E402

from neo.planner import (GIB, PARTITIONERS, Placement, PlanningError, Shard, ShardingType,  # noqa: E402
                         TableConstraints, TablePlan, TableSpec, Topology, evaluate_plan, plan_tables)
from neo.planner.workloads import production_like_tables  # noqa: E402


def end_to_end(n: int, repeat: int) -> dict:
    """Seconds of ``neo plan CONFIG`` in a new process on an ``n``-table config (best of ``repeat``)."""
    import subprocess
    import tempfile

    import yaml

    from neo.planner.workloads import production_like_config

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"plan_{n}_tables.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(production_like_config(n), f, sort_keys=False)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "neo.cli", "plan", path, "--max-tables", "5"],
                               capture_output=True, text=True)
            times.append(round(time.perf_counter() - t0, 3))
            if p.returncode != 0:
                raise RuntimeError(f"neo plan failed: {p.stderr[-2000:]}")
    return {"tables": n, "world_size": 128, "local_world_size": 8, "seconds_best": min(times), "seconds_all": times,
            "command": f"{sys.executable} -m neo.cli plan plan_{n}_tables.yaml --max-tables 5"}


def torchrec_plan(tables: List[TableSpec], topo: Topology) -> Dict[str, TablePlan]:
    """Run TorchRec's planner on the same tables and translate its plan into Neo shards."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner import Topology as TRTopology
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                  feature_names=[f"{t.name}_f{k}" for k in range(t.num_features)],
                                  data_type=DataType.FP16 if t.weight_bytes == 2 else DataType.FP32) for t in tables]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    tr_topo = TRTopology(world_size=topo.world_size, compute_device="cuda", local_world_size=topo.local_world_size,
                         hbm_cap=int(topo.devices[0].hbm_bytes), ddr_cap=int(topo.devices[0].host_bytes))
    cons = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor] * t.num_features) for t in tables}
    planner = EmbeddingShardingPlanner(topology=tr_topo, batch_size=topo.batch_size_per_rank, constraints=cons)
    plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    params = next(iter(plan.plan.values()))
    out: Dict[str, TablePlan] = {}
    for t in tables:
        ps = params[t.name]
        st = ShardingType(ps.sharding_type)
        placement = Placement.HOST if "uvm" in str(ps.compute_kernel) else Placement.DEVICE
        if ps.sharding_spec is None:
            ranks = ps.ranks if ps.ranks else list(range(topo.world_size))
            shards = tuple(Shard(int(r), 0, t.rows, 0, t.dim) for r in ranks)
        else:
            shards = tuple(Shard(int(s.placement.rank()), int(s.shard_offsets[0]), int(s.shard_sizes[0]),
                                 int(s.shard_offsets[1]), int(s.shard_sizes[1])) for s in ps.sharding_spec.shards)
        out[t.name] = TablePlan(st, shards, placement)
    return out


def _record(name, plan, seconds, topo) -> dict:
    fits = all(r.memory_bytes <= d.hbm_bytes for r, d in zip(plan.ranks, topo.devices))
    u = plan.summary.get("uniform_ms", 0.0)  # input side + latency: the same on every rank
    work = (plan.max_ms - u) / max(plan.mean_ms - u, 1e-12)
    return {"planner": name, "max_ms": round(plan.max_ms, 4), "mean_ms": round(plan.mean_ms, 4),
            "max_over_mean": round(plan.imbalance, 4), "placed_max_over_mean": round(work, 4),
            "seconds": round(seconds, 3),
            "max_hbm_gib": round(max(r.memory_bytes for r in plan.ranks) / GIB, 2), "fits": fits}


def run_case(name: str, n: int, W: int, L: int, hbm_gib: float, seed: int, torchrec: bool) -> dict:
    tables = production_like_tables(n, seed)
    topo = Topology.uniform(W, L, hbm_gib=hbm_gib)
    case = {"case": name, "tables": n, "world_size": W, "local_world_size": L, "hbm_gib": hbm_gib,
            "total_weights_gib": round(sum(t.rows * t.bytes_per_row(t.dim) for t in tables) / GIB, 1),
            "results": []}
    # each of Neo's partitioners alone, then the planner as neo plan runs it; a case whose tables
    # do not fit the ranks under one of them gets that planner's error, and the run goes on
    for planner, partitioners in [(p, (p,)) for p in PARTITIONERS] + [("neo (auto)", PARTITIONERS)]:
        t0 = time.perf_counter()
        try:
            plan = plan_tables(tables, topo, partitioners=partitioners)
        except PlanningError as e:
            case["results"].append({"planner": planner, "error": str(e)[:200]})
            continue
        case["results"].append(_record(planner, plan, time.perf_counter() - t0, topo))
    if torchrec:
        try:
            logging.disable(logging.WARNING)
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            tp = torchrec_plan(tables, topo)
            secs = time.perf_counter() - t0
            case["results"].append(_record("torchrec", evaluate_plan(tables, topo, tp), secs, topo))
        except Exception as e:  # noqa: BLE001 - report, do not crash the benchmark
            case["results"].append({"planner": "torchrec", "error": f"{type(e).__name__}: {str(e)[:200]}"})
        finally:
            logging.disable(logging.NOTSET)
            warnings.resetwarnings()
    return case


def speed(n: int, W: int, L: int, repeat: int) -> dict:
    tables = production_like_tables(n, seed=0)
    topo = Topology.uniform(W, L, hbm_gib=80)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_tables(tables, topo)
        times.append(time.perf_counter() - t0)
    return {"tables": n, "world_size": W, "local_world_size": L, "seconds_best": round(min(times), 3),
            "seconds_all": [round(t, 3) for t in times], "max_over_mean": round(plan.imbalance, 4),
            "partitioner": plan.summary["partitioner"], "proposal": plan.summary["proposal"]}


RIVAL_FAMILIES = ((4, 8, 1e8), (8, 20, 1e6), (8, 40, 1e6))
"""The rivals section's workload families: (ranks, tables, most rows a table)."""


def rivals(seeds: int, start: int = 0) -> dict:
    """The planner's pick against planners restricted to fewer sharding kinds, on the same tables:
    every table forced to one kind (table-, row-, column-wise) and each kind forbidden in turn. A
    restricted planner searches less, but its proposals differ, so it can find a plan the free one
    missed. Three small families (the built-in CPU constants, 8 GiB a rank, batch 1,024), seeds
    ``start`` .. ``start + seeds - 1`` each; a workload or rival that cannot be placed is left out.
    ``ratios``: every comparison's pick / rival (busiest rank); ``cases``: those above 1.001."""
    from dataclasses import replace

    from neo.planner.constants import builtin_constants

    c = builtin_constants("cpu")
    out = {"seeds": [start, start + seeds - 1], "comparisons": 0, "rival_faster": 0, "worst_ratio": 1.0,
           "seconds_free": 0.0, "cases": [], "ratios": []}
    for W, n, max_rows in RIVAL_FAMILIES:
        topo = replace(Topology.uniform(W, W, hbm_gib=8), batch_size_per_rank=1024)
        for seed in range(start, start + seeds):
            tables = production_like_tables(n, seed=seed, max_rows=max_rows)
            t0 = time.perf_counter()
            try:
                free = plan_tables(tables, topo, c)
            except PlanningError:
                continue
            out["seconds_free"] += time.perf_counter() - t0
            kinds = {"uniform " + k.value: [k] for k in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                                                          ShardingType.COLUMN_WISE)}
            kinds.update({"without " + k.value: [s for s in ShardingType if s is not k] for k in ShardingType})
            for name, types in kinds.items():
                try:
                    other = plan_tables([replace(t, constraints=TableConstraints(tuple(types))) for t in tables], topo, c)
                except PlanningError:
                    continue
                r = free.summary["max_ms"] / other.summary["max_ms"]
                out["comparisons"] += 1
                out["ratios"].append({"world_size": W, "tables": n, "seed": seed, "rival": name, "ratio": round(r, 6)})
                out["worst_ratio"] = max(out["worst_ratio"], r)
                if r > 1.001:
                    out["rival_faster"] += 1
                    out["cases"].append({"world_size": W, "tables": n, "max_rows": max_rows, "seed": seed, "rival": name,
                                         "ratio": round(r, 4)})
    out["worst_ratio"] = round(out["worst_ratio"], 4)
    out["seconds_free"] = round(out["seconds_free"], 2)
    return out


def skipping(seeds: int, start: int = 0) -> dict:
    """The planner skips a proposal whose lower bound, by the search's costs, already loses; the
    pick is then ranked at the ranks' own footprints, which that bound does not bound. Against the
    planner that partitions every proposal (``alternatives=1``), on production-like tables at
    24 GiB a rank (the default constants), seeds ``start`` .. ``start + seeds - 1`` of two
    families: how often the picks differ, the ratio of their busiest ranks and objectives (skipping
    / every proposal; > 1: skipping picked worse), and the process time of each search."""
    out = {"families": []}
    for W, n, max_rows in ((8, 20, 1e6), (16, 60, 1e8)):
        topo = Topology.uniform(W, 8, hbm_gib=24)
        fam = {"world_size": W, "tables": n, "max_rows": max_rows, "seeds": [start, start + seeds - 1],
               "compared": 0, "differ": 0, "worst_max_ratio": 1.0, "seconds_skipping": 0.0, "seconds_every": 0.0,
               "cases": []}
        for seed in range(start, start + seeds):
            tables = production_like_tables(n, seed=seed, max_rows=max_rows)
            t0 = time.process_time()
            fast = plan_tables(tables, topo)
            t1 = time.process_time()
            every = plan_tables(tables, topo, alternatives=1)
            fam["seconds_skipping"] += t1 - t0
            fam["seconds_every"] += time.process_time() - t1
            fam["compared"] += 1
            if fast.tables != every.tables:
                r = fast.summary["max_ms"] / every.summary["max_ms"]
                fam["differ"] += 1
                fam["worst_max_ratio"] = max(fam["worst_max_ratio"], r)
                fam["cases"].append({"seed": seed, "max_ratio": round(r, 6),
                                     "objective_ratio": round(fast.summary["objective_ms"] / every.summary["objective_ms"], 6),
                                     "pick": fast.summary["proposal"], "exhaustive_pick": every.summary["proposal"]})
        fam["worst_max_ratio"] = round(fam["worst_max_ratio"], 6)
        fam["seconds_skipping"] = round(fam["seconds_skipping"], 2)
        fam["seconds_every"] = round(fam["seconds_every"], 2)
        out["families"].append(fam)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, type=json_path, help="write the records to this file")
    ap.add_argument("--repeat", type=positive_int, default=3, help="runs of the speed case (best reported)")
    ap.add_argument("--quick", action="store_true", help="small cases only")
    ap.add_argument("--no-torchrec", action="store_true", help="skip TorchRec's planner")
    ap.add_argument("--rival-seeds", type=nonneg_int, default=None,
                    help="workloads per family of the pick against planners restricted to fewer kinds "
                         "(0: skip; default 10, 0 with --quick)")
    ap.add_argument("--rival-seed-start", type=nonneg_int, default=0, help="the first seed of --rival-seeds")
    ap.add_argument("--skip-seeds", type=nonneg_int, default=0,
                    help="workloads per family of the pick with skipping against every proposal partitioned "
                         "(default 0: skip)")
    ap.add_argument("--skip-seed-start", type=nonneg_int, default=0, help="the first seed of --skip-seeds")
    ap.add_argument("--torchrec-max-tables", type=nonneg_int, default=200,
                    help="skip TorchRec above this many tables (its planner takes ~3 min for 200 tables here)")
    args = ap.parse_args(argv)

    trv = None if args.no_torchrec else peer_version("torchrec", "torchrec.distributed.planner")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
            "cpus": os.cpu_count(), "numpy": np.__version__, "torchrec": trv, "machine": machine_info()}
    trnote = trv or ("left out by --no-torchrec: column skipped" if args.no_torchrec
                     else "not available: column skipped")
    print(f"# Neo planner benchmark ({meta['date']}, {meta['cpus']} CPUs, python {meta['python']}, "
          f"torchrec {trnote})\n")
    records = {"meta": meta}
    if not args.quick:
        sp = speed(1000, 128, 8, args.repeat)
        records["speed"] = sp
        print(f"Speed: {sp['tables']} tables on {sp['world_size']} ranks ({sp['world_size'] // 8} x 8): "
              f"best {sp['seconds_best']} s of {sp['seconds_all']} (max/mean {sp['max_over_mean']})\n")
        e2e = end_to_end(1000, args.repeat)
        records["end_to_end"] = e2e
        print(f"neo plan end to end: {e2e['tables']} tables, {e2e['world_size']} ranks: best {e2e['seconds_best']} s "
              f"of {e2e['seconds_all']} (target 3 s)\n")
    cases = [("200 tables, 2x8, 80 GiB", 200, 16, 8, 80, 1), ("200 tables, 2x8, 24 GiB", 200, 16, 8, 24, 2),
             ("500 tables, 4x8, 80 GiB", 500, 32, 8, 80, 3)]
    if not args.quick:
        cases += [("1000 tables, 16x8, 80 GiB", 1000, 128, 8, 80, 0), ("1000 tables, 8x8, 24 GiB", 1000, 64, 8, 24, 4)]
    records["cases"] = []
    print("| case | weights GiB | planner | max ms | mean ms | max/mean | placed max/mean | max HBM GiB | fits | plan s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, n, W, L, hbm, seed in cases:
        case = run_case(name, n, W, L, hbm, seed, trv is not None and n <= args.torchrec_max_tables)
        if trv is not None and n > args.torchrec_max_tables:   # a peer left out says so, in the table and the JSON
            case["results"].append({"planner": "torchrec", "note": f"left out: {n} tables > --torchrec-max-tables "
                                                                   f"{args.torchrec_max_tables} (its planner's time)"})
        records["cases"].append(case)
        for r in case["results"]:
            if "note" in r:
                print(f"| {name} | {case['total_weights_gib']} | {r['planner']} | {r['note']} ||||||")
            elif "error" in r:
                print(f"| {name} | {case['total_weights_gib']} | {r['planner']} | error: {r['error'][:80]} ||||||")
            else:
                print(f"| {name} | {case['total_weights_gib']} | {r['planner']} | {r['max_ms']} | {r['mean_ms']} | "
                      f"{r['max_over_mean']} | {r['placed_max_over_mean']} | {r['max_hbm_gib']} | {'yes' if r['fits'] else 'NO'} | {r['seconds']} |")
        sys.stdout.flush()
    if args.rival_seeds is None:
        args.rival_seeds = 0 if args.quick else 10
    if args.rival_seeds:
        rv = rivals(args.rival_seeds, args.rival_seed_start)
        records["rivals"] = rv
        print(f"\nAgainst planners restricted to fewer kinds ({args.rival_seeds} workloads x {len(RIVAL_FAMILIES)} "
              f"families, seeds {rv['seeds'][0]}-{rv['seeds'][1]}): "
              f"{rv['comparisons']} comparisons, a rival faster by more than 0.1% in {rv['rival_faster']}, "
              f"worst pick / rival {rv['worst_ratio']}; the free planner's time {rv['seconds_free']} s")
        for case in rv["cases"]:
            print(f"  {case}")
    if args.skip_seeds:
        sk = skipping(args.skip_seeds, args.skip_seed_start)
        records["skipping"] = sk
        for f in sk["families"]:
            print(f"\nSkipping by the bound against every proposal partitioned ({f['tables']} tables on "
                  f"{f['world_size']} ranks, seeds {f['seeds'][0]}-{f['seeds'][1]}): picks differ in {f['differ']} "
                  f"of {f['compared']}, worst busiest rank (skipping / every) {f['worst_max_ratio']}; process time "
                  f"{f['seconds_skipping']} s against {f['seconds_every']} s "
                  f"({f['seconds_every'] / max(f['seconds_skipping'], 1e-9):.1f}x)")
            for case in f["cases"]:
                print(f"  {case}")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
