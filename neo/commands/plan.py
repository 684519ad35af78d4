"""``neo plan CONFIG --world-size W --local-world-size L [--out plan.json] [key=value ...]``

Reads the ``tables`` and ``topology`` sections of a Neo config, plans the sharding of
every embedding table and prints a readable report; ``--out`` writes the JSON plan.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from neo.config import ConfigError, load_config
from neo.planner import PARTITIONERS, Plan, PlanningError, format_report, plan_tables


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo plan", description="Plan the sharding of a config's embedding tables.")
    p.add_argument("config", help="Neo YAML config (tables and topology sections)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. topology.hbm_gib=40 tables[0].dim=64")
    p.add_argument("--world-size", type=int, default=None, help="total ranks (default: topology.world_size)")
    p.add_argument("--local-world-size", type=int, default=None,
                   help="ranks per node (default: topology.local_world_size)")
    p.add_argument("--out", default=None, help="write the plan as JSON to this file")
    p.add_argument("--partitioner", choices=("auto",) + PARTITIONERS, default="auto",
                   help="restrict the final plan to one partitioner (default: best of all)")
    p.add_argument("--max-tables", type=int, default=0, help="list at most this many tables in the report (0 = all)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        topo = cfg.topology.to_topology(args.world_size, args.local_world_size)
        consts = cfg.topology.to_cost_constants()
        specs = cfg.table_specs()
        parts = PARTITIONERS if args.partitioner == "auto" else (args.partitioner,)
        plan: Plan = plan_tables(specs, topo, consts, parts)
    except (ConfigError, PlanningError) as e:
        print(f"neo plan: error: {e}", file=sys.stderr)
        return 2
    print(format_report(plan, args.max_tables))
    if args.out:
        plan.save(args.out)
        print(f"\nplan written to {args.out}")
    return 0
