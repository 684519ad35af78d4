"""Stage 6: a readable text report of a :class:`Plan`."""

from __future__ import annotations

from typing import List

from neo.planner.plan import Plan
from neo.planner.types import GIB

__all__ = ["format_report"]


def _shards(tp, max_listed: int = 8) -> str:
    parts = [f"r{s.rank}[{s.row_offset}:{s.row_offset + s.rows}, {s.col_offset}:{s.col_offset + s.cols}]"
             for s in tp.shards]
    if len(parts) > max_listed:
        parts = parts[: max_listed - 1] + [f"... ({len(parts)} shards)"]
    return " ".join(parts)


def _fmt(value, spec: str) -> str:
    """``value`` in format ``spec``, or "-" right-aligned in its width where it is None."""
    if value is None:
        width = "".join(c for c in spec.split(".")[0].split(",")[0] if c.isdigit())
        return "-".rjust(int(width or 1))
    return format(value, spec)


def format_report(plan: Plan, max_tables: int = 0) -> str:
    """Per table its sharding and shards; per rank memory, predicted time, communication;
    the imbalance and the partitioners compared. ``max_tables`` > 0 truncates the table list."""
    lines: List[str] = []
    W, L = plan.world_size, plan.local_world_size
    lines.append(f"Sharding plan: {len(plan.tables)} tables on {W} ranks ({W // L} nodes x {L})")
    lines.append("")
    lines.append("Tables")
    width = max([len(n) for n in plan.tables] + [5])
    lines.append(f"  {'table':{width}s}  {'sharding':17s} {'place':6s} shards (rank[rows, cols])")
    cached = []
    for k, (name, tp) in enumerate(plan.tables.items()):
        if tp.placement.value == "cached":
            cached.append((name, tp))
        if max_tables and k >= max_tables:
            continue
        lines.append(f"  {name:{width}s}  {tp.sharding_type.value:17s} {tp.placement.value:6s} {_shards(tp)}")
    if max_tables and len(plan.tables) > max_tables:
        lines.append(f"  ... {len(plan.tables) - max_tables} more tables")
    if cached:
        lines.append("")
        lines.append("Cached tables (a cache of hot rows in fast memory over a backing store holding every row)")
        lines.append(f"  {'table':{width}s}  {'cache rows':>12s} {'share':>6s} {'expected hit':>12s} "
                     f"{'miss ms/step':>12s}")
        for name, tp in cached:       # a plan from a file may leave out the planner's figures: "-"
            lines.append(f"  {name:{width}s}  {_fmt(tp.cache_rows, '12,d')} {_fmt(tp.cache_load_factor, '6.1%')} "
                         f"{_fmt(tp.expected_hit_rate, '12.3f')} {_fmt(tp.miss_ms, '12.3f')}")
    lines.append("")
    cpu = plan.summary.get("device_kind", "h100") == "cpu"
    fast, slow = ("mem MiB", "store MiB") if cpu else ("HBM MiB", "host MiB")
    lines.append("Ranks")
    lines.append(f"  {'rank':>4s} {'node':>4s} {fast:>10s} {slow:>10s} {'pred ms':>9s} {'compute':>9s} "
                 f"{'comm ms':>9s} {'intra MB':>10s} {'inter MB':>10s} {'shards':>6s}")
    counts = [0] * W
    for tp in plan.tables.values():
        for s in tp.shards:
            counts[s.rank] += 1
    for r in plan.ranks:
        lines.append(f"  {r.rank:4d} {r.rank // L:4d} {r.memory_bytes / 2**20:10.1f} {r.host_memory_bytes / 2**20:10.1f} "
                     f"{r.predicted_ms:9.3f} {r.compute_ms:9.3f} {r.comm_ms:9.3f} {r.comm_bytes_intra / 1e6:10.2f} "
                     f"{r.comm_bytes_inter / 1e6:10.2f} {counts[r.rank]:6d}")
    lines.append("")
    mem = [r.memory_bytes for r in plan.ranks]
    label = "host memory (embeddings)" if cpu else "HBM"
    lines.append(f"Predicted embedding time per step (per rank): max {plan.max_ms:.3f} ms, mean {plan.mean_ms:.3f} ms, "
                 f"imbalance max/mean {plan.imbalance:.3f}; {label} max {max(mem) / GIB:.3f} GiB, "
                 f"min {min(mem) / GIB:.3f} GiB")
    s = plan.summary
    step = s.get("step")
    if step:
        comps = ", ".join(f"{k} {v:.3f}" for k, v in step["components_ms"].items())
        lines.append(f"Predicted step: {step['step_ms']:.3f} ms ({comps}); {step['samples_per_s']:.0f} samples/s")
    if s.get("cost_constants"):
        lines.append(f"Cost constants: {s['cost_constants']}")
    if s:
        lines.append(f"Chosen: partitioner {s.get('partitioner')}, proposal {s.get('proposal')}")
        cands = s.get("candidates", [])
        if cands:
            lines.append("Candidates (proposal / partitioner: max ms, max/mean, fits memory):")
            for c in cands:
                if c["partitioner"] == "bound":        # skipped: its lower bound already lost
                    lines.append(f"  {c['proposal']:22s} {'-':15s} >= {c['max_ms']:.3f} (its lower bound: "
                                 f"not partitioned)")
                    continue
                lines.append(f"  {c['proposal']:22s} {c['partitioner']:15s} {c['max_ms']:9.3f} "
                             f"{c['max_over_mean']:7.3f} {'yes' if c['feasible'] else 'NO'}")
    return "\n".join(lines)
