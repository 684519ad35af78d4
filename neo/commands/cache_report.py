"""``neo cache-report``: hit rates of the cache policies on an id trace, against Belady's optimum.

    neo cache-report TRACE.npy --batch-size B --num-rows N --capacity K[,K...] \\
        [--policies lru,lfu,lookahead,belady] [--lookahead 16] [--ways 32] [--pipelined] --json
    neo cache-report CONFIG --table NAME --batches N [--warmup-batches W] [--capacity K,...] [key=value ...] --json

``TRACE.npy``: a 1-D integer array of the row ids of one table in access order, B ids per
batch. With a config, the trace is the table's ids (all its features) in the first N batches
of the config's training data. Accesses are the distinct ids of each batch; Belady is the
exact optimum over the sequence of every batch's sorted distinct ids. ``--json`` prints one
JSON line per (capacity, policy) with ``capacity``, ``policy``, ``accesses``, ``hits``,
``hit_rate`` (and ``ways``, ``conflict_misses`` for a set-associative cache, ``--ways``: W ways
at most the capacity, ceil(K / W) sets as FBGEMM sizes them, holding exactly K rows together),
and for lru, lfu and lookahead ``model_hit_rate``, the planner's steady-state model of the
policy at ``model_skew``, the Zipf exponent fitted to the trace's distinct rows a batch (what
``neo plan`` expects with that ``access_skew``).
Capacities default to 1, 2, 5, 10, 20 and 50% of the rows. ``--warmup-batches W``: the first W
batches only warm the caches (config mode reads W + N), so the rates are those of caches in use,
not of empty ones filling (from empty, every first access of a row misses: on
``configs/cached_tables.yaml`` 20 batches give 0.34 at every capacity and policy, Belady's
included). The records then carry ``warmup_batches``. See docs/cache.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from typing import List, Optional, Tuple

import numpy as np

from neo.commands.arg_types import non_negative_int, positive_int
from neo.embedding.cache.simulate import POLICIES, batch_rows, report, rows_needed

_DEFAULT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


class CacheReportError(ValueError):
    """Bad arguments or data; the message names the field, file or numbers."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo cache-report", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="TRACE.npy (1-D row ids) or a Neo YAML config")
    p.add_argument("overrides", nargs="*", help="config mode: dotted overrides")
    p.add_argument("--batch-size", type=positive_int, default=None, help="ids per batch (config mode: samples per batch, "
                   "default train.batch_size)")
    p.add_argument("--num-rows", type=positive_int, default=None, help="rows of the table (trace mode)")
    p.add_argument("--capacity", default=None, help="cache rows, comma-separated (default: 1-50%% of the rows)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated subset of {','.join(POLICIES)}")
    p.add_argument("--lookahead", type=non_negative_int, default=16, help="batches the lookahead policy sees (default 16)")
    p.add_argument("--ways", type=positive_int, default=None,
                   help="simulate a set-associative cache with this many ways (at most every capacity; "
                        "ceil(K / ways) sets holding K rows together)")
    p.add_argument("--pipelined", action="store_true", help="two batches pinned at a time, as under the pipeline")
    p.add_argument("--table", default=None, help="config mode: the table")
    p.add_argument("--batches", type=positive_int, default=None, help="config mode: batches of training data to trace")
    p.add_argument("--warmup-batches", type=non_negative_int, default=0,
                   help="batches that only warm the caches before the counted ones (config mode: read before the "
                        "--batches; trace mode: the trace's first); default 0: every batch counted from empty caches")
    p.add_argument("--json", action="store_true", help="one JSON line per (capacity, policy)")
    return p


def config_trace(path: str, overrides: List[str], table: str, batches: int,
                 batch_size: Optional[int]) -> Tuple[List[np.ndarray], int]:
    """(the ids of ``table`` (all its features) in each of the first ``batches`` batches of the
    config's training data, rows of the table)."""
    from neo.config import load_config
    from neo.train.build import resolve_tables
    from neo.train.data import feature_mapping, make_loaders, prepare_data, rename_features

    cfg = load_config(path, overrides)
    if batch_size:
        cfg.train.batch_size = batch_size
    tables = resolve_tables(cfg)
    match = [t for t in tables if t.name == table]
    if not match:
        raise CacheReportError(f"--table: no table {table!r} in {path} (tables: {[t.name for t in tables]})")
    t = match[0]
    pg = types.SimpleNamespace(rank=0, world_size=1)
    data = prepare_data(cfg, tables, pg, log=lambda *a, **k: None)
    loader, _ = make_loaders(cfg, data, pg)
    mapping = feature_mapping(loader.meta.sparse_names, tables)
    parts: List[np.ndarray] = []
    it = iter(loader)
    try:
        for batch in it:
            sparse = rename_features(batch, mapping).sparse
            parts.append(np.concatenate([sparse.feature(f)[0].numpy() for f in t.feature_names]).astype(np.int64))
            if len(parts) >= batches:
                break
    finally:
        it.close()
        loader.close()                # its reader thread joined before the command exits
    if len(parts) < batches:
        raise CacheReportError(f"--batches {batches}: the training data has only {len(parts)} batches of "
                               f"{cfg.train.batch_size} samples")
    return parts, t.num_rows


def _capacities(spec: Optional[str], num_rows: int) -> List[int]:
    if spec is None:
        return sorted({max(1, int(round(f * num_rows))) for f in _DEFAULT_FRACTIONS})
    try:
        caps = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise CacheReportError(f"--capacity: expected comma-separated integers, got {spec!r}") from None
    bad = [k for k in caps if not 0 < k <= num_rows]
    if bad or not caps:
        raise CacheReportError(f"--capacity: {bad or spec!r} not in [1, --num-rows {num_rows}]")
    return caps


def run(args) -> List[dict]:
    if args.lookahead > 62:             # (the index's window mask holds 63 batches: cut to it, silently, before)
        raise CacheReportError(f"--lookahead {args.lookahead}: at most 62, as a table's cache_lookahead in training")
    if args.source.endswith(".npy"):
        if args.batch_size is None or args.num_rows is None:
            raise CacheReportError("a trace needs --batch-size and --num-rows")
        if not os.path.isfile(args.source):
            raise CacheReportError(f"trace file {args.source!r} does not exist")
        try:
            trace = np.load(args.source, allow_pickle=False)
        except EOFError:                # np.load of an empty file
            raise CacheReportError(f"trace file {args.source!r} is empty (0 bytes), not a numpy array") from None
        except ValueError as e:
            raise CacheReportError(f"trace file {args.source!r} is not a numpy array: {e}") from None
        B, N = args.batch_size, args.num_rows
    else:
        if not args.table or not args.batches:
            raise CacheReportError("config mode needs --table NAME and --batches N")
        parts, N = config_trace(args.source, args.overrides, args.table, args.batches + args.warmup_batches,
                                args.batch_size)
        trace, B = np.concatenate(parts), None
    try:
        batches = batch_rows(trace, B, N) if B else [batch_rows(p, max(1, len(p)), N)[0] for p in parts]
    except ValueError as e:
        raise CacheReportError(f"{args.source}: {e}") from None
    if not batches or not any(len(b) for b in batches):
        raise CacheReportError(f"{args.source}: the trace is empty")
    if args.warmup_batches >= len(batches):
        raise CacheReportError(f"--warmup-batches {args.warmup_batches}: the trace has only {len(batches)} batches; "
                               "none would be counted")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise CacheReportError(f"--policies: {bad} not in {list(POLICIES)}")
    if not policies:
        raise CacheReportError(f"--policies {args.policies!r}: names no policy; give a comma-separated subset of "
                               f"{','.join(POLICIES)}")
    caps = _capacities(args.capacity, N)
    over = [k for k in caps if args.ways is not None and args.ways > k]
    if over:
        raise CacheReportError(f"--ways {args.ways}: more ways than the cache has rows (capacities {over}); "
                               f"ways must be <= every capacity")
    need = rows_needed(batches, args.pipelined)    # with --pipelined: two consecutive batches' union (as simulate)
    small = [k for k in caps if k < need and any(p != "belady" for p in policies)]
    if small:
        raise CacheReportError(f"--capacity {small}: below the {need} distinct rows "
                               f"{'two consecutive batches' if args.pipelined else 'one batch'} of this trace need")
    rows = [r.to_dict() for r in report(batches, N, caps, policies, args.lookahead, args.ways, args.pipelined,
                                        args.warmup_batches)]
    add_model(rows, batches, N, len(trace) / len(batches), args.lookahead)     # config mode: a batch per part
    return rows


def add_model(rows: List[dict], batches: List[np.ndarray], num_rows: int, ids_per_batch: float, lookahead: int) -> None:
    """Put the planner's skew model beside each fully associative lru, lfu and lookahead record:
    ``model_hit_rate`` (:func:`neo.planner.cache_model.hit_rate`, the steady state of the
    record's policy) at ``model_skew``, the Zipf exponent under which ``ids_per_batch`` ids give
    the trace's mean distinct rows a batch (:func:`~neo.planner.cache_model.fit_skew`): what
    ``neo plan`` would expect of this table with ``access_skew: model_skew``."""
    from neo.planner.cache_model import POLICIES as MODELLED
    from neo.planner.cache_model import fit_skew, hit_rate

    skew = fit_skew(num_rows, ids_per_batch, float(np.mean([len(b) for b in batches])))
    for r in rows:
        if r["policy"] in MODELLED and r.get("ways") is None:
            r["model_hit_rate"] = hit_rate(r["capacity"] / num_rows, num_rows, skew, ids_per_batch,
                                           policy=r["policy"], lookahead=lookahead)
            r["model_skew"] = skew


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    try:
        rows = run(args)
    except Exception as e:   # noqa: BLE001 - config, planner, data and argument errors end here, named
        from neo.config import ConfigError
        if isinstance(e, (MemoryError, RuntimeError)) and "alloc" in str(e).lower():
            e = CacheReportError(f"the index of --num-rows {args.num_rows} rows does not fit in memory (its "
                                 f"per-row arrays take 4 to 16 bytes a row): {str(e).splitlines()[0]}")
        elif not isinstance(e, (CacheReportError, ConfigError, OSError)):
            raise
        print(f"neo cache-report: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    if args.warmup_batches:
        print(f"hit rates after {args.warmup_batches} batches warming the caches (not counted)")
    best = {r["capacity"]: r["hit_rate"] for r in rows if r["policy"] == "belady"}
    print(f"{'capacity':>10s} {'policy':>10s} {'accesses':>10s} {'hits':>10s} {'hit rate':>9s} {'/ belady':>9s} "
          f"{'model':>7s}")
    for r in rows:
        rel = f"{r['hit_rate'] / best[r['capacity']]:.3f}" if best.get(r["capacity"]) else "-"
        model = f"{r['model_hit_rate']:.4f}" if "model_hit_rate" in r else "-"
        print(f"{r['capacity']:>10d} {r['policy']:>10s} {r['accesses']:>10d} {r['hits']:>10d} "
              f"{r['hit_rate']:>9.4f} {rel:>9s} {model:>7s}")
    skews = {r["model_skew"] for r in rows if "model_skew" in r}
    if skews:
        print(f"model: the planner's steady-state hit rate of each policy for Zipf ids at the exponent fitted to this "
              f"trace's distinct rows a batch, {skews.pop():.3f} (neo plan's access_skew); compare it with "
              f"--warmup-batches")
    return 0
