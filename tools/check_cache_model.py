#!/usr/bin/env python3
"""The planner's skew model of a cache's hit rate against the cache simulated to its steady state.

    python tools/check_cache_model.py --rows 200000 --alphas 0.8,1.05,1.2 --ids 512,2048 \
        --shares 0.02,0.05,0.2 --json bench_out/cache_model.json

For each (Zipf exponent, ids a batch, cache share): the model's hit rate per policy
(:func:`neo.planner.cache_model.hit_rate`: ``lfu`` the static top share, ``lru`` Che's
approximation, ``lookahead`` Che's at T + L, at most the top share) and the steady state of the
same cache simulated on Zipf ids (:class:`neo.embedding.cache.simulate.SteadyHitRate`: misses
past twice the capacity, then ``--counted`` batches), as the planner's statistics describe a
table. Records: ``rows``, ``alpha``, ``ids_per_batch``, ``share``, ``policy``, ``model``,
``simulated``, ``error`` (model - simulated). Prints the table and each policy's largest error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import write_json  # noqa: E402
from data_pipeline.locality import zipf_ranks  # noqa: E402
from neo.embedding.cache.index import CacheCapacityError  # noqa: E402
from neo.embedding.cache.simulate import SteadyHitRate  # noqa: E402
from neo.planner.cache_model import POLICIES, hit_rate  # noqa: E402


def floats(s: str):
    return [float(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--alphas", type=floats, default=[0.8, 1.05, 1.2])
    p.add_argument("--ids", type=floats, default=[512, 2048], help="ids a batch")
    p.add_argument("--shares", type=floats, default=[0.02, 0.05, 0.2], help="cache shares of the rows")
    p.add_argument("--lookahead", type=int, default=32, help="the lookahead policy's window, batches")
    p.add_argument("--counted", type=int, default=100, help="warm batches counted per cache")
    p.add_argument("--max-batches", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    records, t0 = [], time.time()
    print(f"{'alpha':>5} {'ids':>6} {'share':>6} " + " ".join(f"{pol + ' model/sim':>20}" for pol in POLICIES))
    for alpha in args.alphas:
        for n in args.ids:
            rng = np.random.default_rng(args.seed)
            for share in args.shares:
                capacity = int(share * args.rows)
                cells = []
                for policy in POLICIES:
                    sim = SteadyHitRate(args.rows, capacity, policy, args.lookahead, counted=args.counted)
                    batches = 0
                    try:
                        while not sim.done and batches < args.max_batches:
                            sim.feed(np.unique(zipf_ranks(rng, int(n), args.rows, alpha)))
                            batches += 1
                        sim.finish()
                        measured = sim.hit_rate if sim.done else None
                    except CacheCapacityError:
                        measured = None                  # the cache holds less than two batches
                    model = hit_rate(share, args.rows, alpha, n, policy=policy, lookahead=args.lookahead)
                    records.append({"rows": args.rows, "alpha": alpha, "ids_per_batch": n, "share": share,
                                    "policy": policy, "lookahead": args.lookahead, "model": model,
                                    "simulated": measured, "batches": batches,
                                    "error": None if measured is None else model - measured})
                    cells.append(f"{model:.3f}/" + ("  -  " if measured is None else f"{measured:.3f}"))
                print(f"{alpha:5.2f} {int(n):6d} {share:6.3f} " + " ".join(f"{c:>20}" for c in cells), flush=True)
    for policy in POLICIES:
        errs = [r["error"] for r in records if r["policy"] == policy and r["error"] is not None]
        if errs:
            worst = max(errs, key=abs)
            print(f"{policy}: largest error {worst:+.3f} (model - simulated), mean |error| "
                  f"{np.mean(np.abs(errs)):.3f}, over {len(errs)} caches")
    print(f"({time.time() - t0:.0f} s)")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
