"""Heterogeneous devices grouped into virtual workers of equal total speed, and each worker's dense split.

HetPipe (Park et al., "HetPipe: Enabling Large DNN Training on (Whimpy) Heterogeneous GPU
Clusters through Integration of Pipelined Model Parallelism and Data Parallelism", ATC 2020,
sections 3-4) groups a cluster's devices into *virtual workers* (VWs): each VW holds one replica
of the model, pipelined across its devices, and the VWs train data-parallel under WSP
(:mod:`neo.async_train.wsp`). Two choices make the VWs equally fast:

1. :func:`group_virtual_workers`: devices into VWs so that their total speeds are balanced
   (longest-processing-time greedy, fastest device first, then pairwise moves and swaps while
   they lower the fastest-minus-slowest spread);
2. :func:`split_dense`: inside each VW, the dense layers cut into one stage per device, in
   proportion to speed, by PipeDream's partitioner with per-device speeds
   (:func:`neo.pipeline.partition.partition`), trying every order of the VW's devices (up to 6).

Both are pure functions; :func:`virtual_worker_plan` combines them with a config's topology
into a JSON-able report (``python -m neo.async_train.virtual_workers CONFIG --profile P.json
--workers 2``). Worked example, speeds ``[1, 1, 1, 1/3]`` into 2 VWs::

    group_virtual_workers([1, 1, 1, 1/3], 2)  ->  [[0, 2], [1, 3]]    totals 2.0 and 1.33
    (no grouping does better: the slow device goes with one fast one, spread 0.67)

The embedding tables are placed by the planner, which already divides each rank's lookup time
by its device's speed (:mod:`neo.planner.planner`, ``topology.devices[k].speed``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["group_virtual_workers", "split_dense", "virtual_worker_plan", "main"]


def _speeds(devices: Sequence[Any]) -> List[float]:
    out = []
    for k, d in enumerate(devices):
        s = float(getattr(d, "speed", d))
        if not s > 0 or s != s or s == float("inf"):
            raise ValueError(f"devices[{k}]: speed must be a finite number > 0, got {s!r}")
        out.append(s)
    return out


def group_virtual_workers(devices: Sequence[Any], workers: int) -> List[List[int]]:
    """Device indices of each of ``workers`` virtual workers, total speeds balanced.

    Args:
        devices: per device its relative speed (a number, or an object with ``.speed`` such as
            :class:`neo.planner.types.Device`).
        workers: how many virtual workers (1 <= workers <= len(devices): each needs a device).

    Returns the groups, each sorted, ordered by their first device."""
    speeds = _speeds(devices)
    n = len(speeds)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: must be an integer >= 1, got {workers!r}")
    if workers > n:
        raise ValueError(f"workers: {workers} virtual workers for {n} devices: a virtual worker with no device")
    groups: List[List[int]] = [[] for _ in range(workers)]
    total = [0.0] * workers
    for d in sorted(range(n), key=lambda i: (-speeds[i], i)):                  # LPT: fastest first
        k = min(range(workers), key=lambda g: (total[g], len(groups[g]), g))
        groups[k].append(d)
        total[k] += speeds[d]

    def spread(t: Sequence[float]) -> float:
        return max(t) - min(t)

    improved = True
    while improved:                                                            # moves and swaps
        improved = False
        for a, b in itertools.permutations(range(workers), 2):
            for da in list(groups[a]):
                if len(groups[a]) > 1:                                         # move da: a -> b
                    t = list(total)
                    t[a] -= speeds[da]
                    t[b] += speeds[da]
                    if spread(t) < spread(total) - 1e-12:
                        groups[a].remove(da)
                        groups[b].append(da)
                        total, improved = t, True
                        break
                for db in list(groups[b]):                                     # swap da <-> db
                    t = list(total)
                    t[a] += speeds[db] - speeds[da]
                    t[b] += speeds[da] - speeds[db]
                    if spread(t) < spread(total) - 1e-12:
                        groups[a][groups[a].index(da)] = db
                        groups[b][groups[b].index(db)] = da
                        total, improved = t, True
                        break
                if improved:
                    break
            if improved:
                break
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def split_dense(profile, groups: Sequence[Sequence[int]], devices: Sequence[Any],
                bandwidth_gbps: Optional[float] = None) -> List[Dict[str, Any]]:
    """For each virtual worker, its dense layers split into one contiguous stage per device, each
    stage's work in proportion to its device's speed (PipeDream's DP, ``speeds=``), the devices in
    the order with the least bottleneck (every order for up to 6 devices, else fastest first).

    Returns per worker ``{"devices": [...], "speeds": [...], "stages": [[first, last], ...],
    "stage_ms": [...], "bottleneck_ms": ms}``, stage k on ``devices[k]``."""
    from neo.pipeline.partition import PartitionError, partition

    speeds = _speeds(devices)
    L = len(profile.layers)
    out = []
    for k, group in enumerate(groups):
        if not group:
            raise PartitionError(f"groups[{k}]", "a virtual worker with no device")
        if len(group) > L:
            raise PartitionError(f"groups[{k}]", f"{len(group)} devices but the model has {L} layers "
                                 "(a stage per device)")
        orders = itertools.permutations(group) if len(group) <= 6 else \
            [tuple(sorted(group, key=lambda d: (-speeds[d], d)))]
        best = None
        for order in orders:
            part = partition(profile, len(order), bandwidth_gbps, speeds=[speeds[d] for d in order])
            if best is None or part.bottleneck_ms < best[1].bottleneck_ms - 1e-12:
                best = (order, part)
        order, part = best
        out.append({"devices": list(order), "speeds": [speeds[d] for d in order],
                    "stages": [list(s) for s in part.stages], "stage_ms": [round(x, 6) for x in part.stage_ms],
                    "bottleneck_ms": round(part.bottleneck_ms, 6)})
    return out


def virtual_worker_plan(cfg, workers: int, profile=None, world_size: Optional[int] = None,
                        local_world_size: Optional[int] = None, bandwidth_gbps: Optional[float] = None) -> Dict[str, Any]:
    """The virtual workers of ``cfg``'s topology (``topology.devices`` speeds) and, with a layer
    profile (``neo profile-layers``), each one's dense split. JSON-able. ``world_size`` and
    ``local_world_size`` (None: the config's) must be integers >= 1."""
    for name, v in (("world_size", world_size), ("local_world_size", local_world_size)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
    W = world_size or cfg.topology.world_size
    topo = cfg.topology.to_topology(W, local_world_size or cfg.topology.local_world_size or W)
    speeds = [d.speed for d in topo.devices]
    groups = group_virtual_workers(speeds, workers)
    report: Dict[str, Any] = {
        "speeds": speeds, "virtual_workers": groups,
        "total_speed": [round(sum(speeds[d] for d in g), 6) for g in groups],
    }
    if profile is not None:
        report["dense_split"] = split_dense(profile, groups, speeds, bandwidth_gbps)
        report["layers"] = [layer.name for layer in profile.layers]
    return report


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m neo.async_train.virtual_workers CONFIG --workers K [--profile P.json [--bandwidth-gbps G]]
    [--world-size W] [--local-world-size L]``"""
    from neo.commands.arg_types import positive_float, positive_int
    from neo.config import ConfigError, load_config
    from neo.pipeline.partition import PartitionError, load_profile

    p = argparse.ArgumentParser(prog="python -m neo.async_train.virtual_workers",
                                description="Group a heterogeneous topology into virtual workers of equal speed.")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--workers", type=positive_int, required=True, help="virtual workers")
    p.add_argument("--profile", default=None, help="layer profile (neo profile-layers --out): split each worker's layers")
    p.add_argument("--world-size", type=positive_int, default=None, help="total ranks (default: topology.world_size)")
    p.add_argument("--local-world-size", type=positive_int, default=None,
                   help="ranks per node (default: topology.local_world_size); --world-size must be a multiple of it")
    p.add_argument("--bandwidth-gbps", type=positive_float, default=None,
                   help="with --profile: point-to-point GB/s of the dense split (default: the profile's)")
    args = p.parse_intermixed_args(argv)
    if args.bandwidth_gbps is not None and not args.profile:
        print("virtual_workers: error: --bandwidth-gbps needs --profile (it is the bandwidth of the dense split, "
              "which only a profile gives)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        profile = load_profile(args.profile) if args.profile else None
        report = virtual_worker_plan(cfg, args.workers, profile, args.world_size, args.local_world_size,
                                     bandwidth_gbps=args.bandwidth_gbps)
    except (ConfigError, PartitionError, ValueError) as e:
        print(f"virtual_workers: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
