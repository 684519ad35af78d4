"""``neo plan CONFIG --world-size W --local-world-size L [--out plan.json] [key=value ...]``

Reads the ``tables`` and ``topology`` sections of a Neo config, plans the sharding of
every embedding table and prints a readable report; ``--out`` writes the JSON plan.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import List, Optional

from neo.commands.arg_types import non_negative_int, output_problem, positive_int
from neo.config import ConfigError, load_config
from neo.planner import PARTITIONERS, Plan, PlanningError, format_report, plan_tables


def _world_sizes(text: str) -> List[int]:
    """``--simulate 8,16,32``: a non-empty list of positive world sizes."""
    sizes = [positive_int(w.strip()) for w in text.split(",") if w.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected world sizes such as 8,16,32, got {text!r}")
    return sizes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo plan", description="Plan the sharding of a config's embedding tables.")
    p.add_argument("config", help="Neo YAML config (tables and topology sections)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. topology.hbm_gib=40 tables[0].dim=64")
    p.add_argument("--world-size", type=positive_int, default=None, help="total ranks (default: topology.world_size)")
    p.add_argument("--local-world-size", type=positive_int, default=None,
                   help="ranks per node (default: topology.local_world_size)")
    p.add_argument("--out", default=None, help="write the plan as JSON to this file")
    p.add_argument("--partitioner", choices=("auto",) + PARTITIONERS, default="auto",
                   help="restrict the final plan to one partitioner (default: best of all)")
    p.add_argument("--max-tables", type=non_negative_int, default=0,
                   help="list at most this many tables in the report (0 = all)")
    p.add_argument("--simulate", nargs="?", type=_world_sizes, const=[8, 16, 32, 64, 128], default=None,
                   metavar="W,W,...",
                   help="predict the step time, samples/s and per-rank breakdown at these world sizes "
                        "(default 8,16,32,64,128; batch per rank from train.batch_size) instead of one plan")
    p.add_argument("--strong", action="store_true",
                   help="with --simulate: keep the global batch of topology.world_size x train.batch_size")
    p.add_argument("--json", action="store_true", help="with --simulate: one JSON line per world size")
    return p


def simulate(cfg, sizes: List[int], strong: bool, as_json: bool) -> int:
    """The predicted step at each world size (``neo plan --simulate``)."""
    import json

    from neo.planner.step_model import predict_step

    if not cfg.tables:
        raise ConfigError("--simulate: the config has no tables")
    dense = cfg.dense_spec()
    if dense is None:
        raise ConfigError("--simulate: the tables' dims differ, so there is no DLRM step to predict")
    cfg.model.check_tables([t.dim for t in cfg.tables for _ in range(len(t.feature_names) or 1)])   # as neo train
    L0 = cfg.topology.local_world_size or 8
    base_w = cfg.topology.world_size or sizes[0]
    B0 = cfg.planning_batch()
    rows = []
    for W in sizes:
        L = min(L0, W)
        B = max(1, B0 * base_w // W) if strong else B0
        topo = replace(cfg.topology.to_topology(W, L), batch_size_per_rank=B)
        consts, what = cfg.cost_constants(W)
        plan = plan_tables(cfg.table_specs(), topo, consts)
        pred = predict_step(plan, cfg.table_specs(), dense, topo, consts)
        types: dict = {}
        for tp in plan.tables.values():
            types[tp.sharding_type.value] = types.get(tp.sharding_type.value, 0) + 1
        rows.append({"world_size": W, "nodes": W // L, "batch_per_rank": B, "global_batch": B * W,
                     "step_ms": round(pred.step_ms, 3), "samples_per_s": round(pred.samples_per_s),
                     "components_ms": {k: round(v, 3) for k, v in pred.components_ms.items()},
                     "rank_ms_max": round(max(pred.rank_ms), 3),
                     "rank_ms_mean": round(sum(pred.rank_ms) / len(pred.rank_ms), 3),
                     "sharding_types": types, "device_kind": consts.device_kind, "cost_constants": what})
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"Simulated step of {len(cfg.tables)} tables, {'strong' if strong else 'weak'} scaling "
          f"({rows[0]['device_kind']} constants: {rows[0]['cost_constants']})")
    print(f"{'W':>5s} {'nodes':>5s} {'batch/rank':>10s} {'step ms':>9s} {'samples/s':>12s} {'scaling':>8s} "
          f"{'emb fwd':>8s} {'emb bwd':>8s} {'in dist':>8s} {'out dist':>8s} {'dense':>7s} {'rank max/mean':>13s}")
    for r in rows:
        c = r["components_ms"]
        eff = r["samples_per_s"] / rows[0]["samples_per_s"] * rows[0]["world_size"] / r["world_size"]
        print(f"{r['world_size']:5d} {r['nodes']:5d} {r['batch_per_rank']:10d} {r['step_ms']:9.3f} "
              f"{r['samples_per_s']:12,d} {eff:8.2f} {c['embedding_fwd']:8.3f} {c['embedding_bwd']:8.3f} "
              f"{c['input_dist']:8.3f} {c['output_dist']:8.3f} {c['dense']:7.3f} "
              f"{r['rank_ms_max'] / max(r['rank_ms_mean'], 1e-9):13.3f}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        cfg.sharding.check_tables([t.name for t in cfg.tables])      # as neo train: pins name tables
        if args.simulate is None and (args.strong or args.json):
            raise ConfigError(f"{'--strong' if args.strong else '--json'}: only with --simulate (the plan's own "
                              f"output is its report, and its JSON is --out FILE)")
        if args.simulate is not None and args.out:
            raise ConfigError("--out: writes a plan, which --simulate does not make (it predicts steps)")
        if args.out:                  # found now, not after the planning and its report
            why = output_problem(args.out)
            if why:
                raise ConfigError(f"--out {args.out}: {why}")
        if args.simulate:
            return simulate(cfg, args.simulate, args.strong, args.json)
        topo = cfg.topology.to_topology(args.world_size, args.local_world_size)
        topo = replace(topo, batch_size_per_rank=cfg.planning_batch())
        consts, what = cfg.cost_constants(topo.world_size)
        specs = cfg.table_specs()
        parts = PARTITIONERS if args.partitioner == "auto" else (args.partitioner,)
        plan: Plan = plan_tables(specs, topo, consts, parts)
        plan.summary["cost_constants"] = what
    except (ConfigError, PlanningError) as e:
        print(f"neo plan: error: {e}", file=sys.stderr)
        return 2
    print(format_report(plan, args.max_tables))
    if args.out:
        try:
            plan.save(args.out)
        except OSError as e:
            print(f"neo plan: error: --out {args.out}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"\nplan written to {args.out}")
    return 0
