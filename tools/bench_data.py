#!/usr/bin/env python3
"""Benchmark of the data pipeline: Criteo preprocessing lines/s and loader samples/s.

    python tools/bench_data.py --json bench.json [--rows 2000000] [--tsv-lines 2000000] [--workdir DIR]

1. Raw TSV: the 200 real rows of ``data_pipeline/samples/criteo_kaggle_sample.tsv`` replicated with varied
   ids (each copy XORs the hex ids with a per-copy constant) up to ``--tsv-lines`` lines; then
   ``criteo-preprocess`` with 1 worker, 2 worker threads and 2 worker processes (target: 200k lines/s per core); the fixed
   start-up cost (measured on the 200-line sample) is reported and excluded from the "steady" rates.
2. A Criteo-layout synthetic data set (13 dense, 26 one-hot sparse, ``--rows`` samples); then the
   loader, batch ``--batch-size``: one loader with one background thread (one core), one loader
   with Arrow's thread pool, and two ranks in two processes at once, as under DDP (two cores)
   (target: 1M samples/s per core).
3. First, a shuffled multi-hot batch's gather from a window's row groups: the previous numpy code
   and Neo's C++ copy (``neo._C.jagged_take``), side by side (``--take-only``: only this).

Wall time and CPU time are recorded; "per core" rates divide by the cores used (1 or 2), "per CPU-s"
rates divide by the CPU seconds used (the honest per-core figure on a machine shared with other jobs).
The two gathers of 3. are timed interleaved (each repetition runs both, neither right after itself:
bench_common.call_orders), so that load from other jobs hits them alike; the preprocessing runs,
the synthesis and the loader modes are one timed pass each (after the loader's warm-up pass), run one
after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench_common import describe_machine, json_path, machine_info, positive_int, time_interleaved, write_json  # noqa: E402

PREPROCESS_TARGET = 200_000  # lines / s / core
LOADER_TARGET = 1_000_000  # samples / s / core


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def make_tsv(sample: str, path: str, lines: int) -> int:
    with open(sample, "rb") as f:
        rows = [ln.split(b"\t") for ln in f.read().split(b"\n") if ln]
    block: List[bytes] = []
    copies = 0
    while len(block) < min(lines, 20000):
        x = (copies * 2654435761) & 0xFFFFFFFF
        for r in rows:
            cats = [b"%08x" % (int(c, 16) ^ x) if c else b"" for c in r[14:]]
            block.append(b"\t".join(r[:14] + cats))
        copies += 1
    text = b"\n".join(block) + b"\n"
    written = 0
    with open(path, "wb") as f:
        while written < lines:
            take = min(len(block), lines - written)
            f.write(text if take == len(block) else b"\n".join(block[:take]) + b"\n")
            written += take
    return written


def bench_preprocess(tsv: str, tiny: str, out: str, workers: int, lines: int, executor: str) -> Dict[str, Any]:
    """Preprocess ``tsv``; the fixed cost (spawning workers, imports, opening writers) is measured on
    ``tiny`` (200 lines) with the same settings and reported, and subtracted for the steady rate."""
    from data_pipeline.criteo import CriteoOptions, preprocess_criteo

    def run(path: str):
        shutil.rmtree(out, ignore_errors=True)
        c0, t0 = cpu_seconds(), time.perf_counter()
        s = preprocess_criteo(CriteoOptions(inputs=[path], output=out, workers=workers, executor=executor), log=lambda m: None)
        return s, time.perf_counter() - t0, cpu_seconds() - c0

    _, w0, c0 = run(tiny)
    s, wall, cpu = run(tsv)
    assert s["rows_written"] == lines, s["rows_written"]
    cores = min(workers, os.cpu_count() or 1)
    rate = lines / wall
    # The steady rate subtracts the start-up run's time; where little is left (under 10% of the run,
    # or 1 ms: e.g. the tiny run paid one-time import costs the big one did not), the difference is
    # noise and the rate would be a nonsense number (1e13 lines/s): write null and say why.
    steady_ok = wall - w0 >= max(0.1 * wall, 1e-3)
    steady_cpu_ok = cpu - c0 >= max(0.1 * cpu, 1e-3)
    notes = []
    if not steady_ok:
        notes.append(f"steady_lines_per_s_per_core: null, the run's wall time ({wall:.3f} s) is not meaningfully "
                     f"above the start-up run's ({w0:.3f} s); use more --tsv-lines")
    if not steady_cpu_ok:
        notes.append(f"steady_lines_per_cpu_s: null, the run's CPU time ({cpu:.3f} s) is not meaningfully "
                     f"above the start-up run's ({c0:.3f} s); use more --tsv-lines")
    for n in notes:
        print(f"note (workers={workers}): {n}", flush=True)
    return {"name": f"criteo-preprocess workers={workers}" + (f" ({executor} pool)" if workers > 1 else ""), "lines": lines, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "lines_per_s": round(rate), "cores": cores,
            "lines_per_s_per_core": round(rate / cores), "lines_per_cpu_s": round(lines / cpu) if cpu > 0 else None,
            "startup_wall_s": round(w0, 3), "startup_cpu_s": round(c0, 3),
            "steady_lines_per_s_per_core": round(lines / (wall - w0) / cores) if steady_ok else None,
            "steady_lines_per_cpu_s": round(lines / (cpu - c0)) if steady_cpu_ok else None,
            "target_per_core": PREPROCESS_TARGET, "ratio_to_target": round(rate / cores / PREPROCESS_TARGET, 2),
            **({"notes": notes} if notes else {})}


def _drain(path: str, opts) -> int:
    from data_pipeline.loader import ParquetLoader
    n = 0
    for b in ParquetLoader(path, opts):
        n += b.batch_size
    return n


def _rank_job(job: tuple) -> tuple:
    """One rank in its own process (as under DDP): warm-up epoch, then a timed epoch."""
    path, batch, rank, world, barrier_time = job
    import torch
    torch.set_num_threads(1)
    from data_pipeline.loader import LoaderOptions
    o = LoaderOptions(batch_size=batch, rank=rank, world_size=world)
    _drain(path, o)
    while time.time() < barrier_time:  # start both ranks together
        time.sleep(0.001)
    c0, t0 = time.process_time(), time.perf_counter()
    n = _drain(path, o)
    return n, time.perf_counter() - t0, time.process_time() - c0


def bench_loader(path: str, batch: int, mode: str, rows: int) -> Dict[str, Any]:
    from data_pipeline.loader import LoaderOptions
    if mode == "2 ranks (2 processes)":
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(2) as pool:
            start = time.time() + 8.0
            res = pool.map(_rank_job, [(path, batch, r, 2, start) for r in range(2)])
        n = sum(r[0] for r in res)
        wall, cpu, cores = max(r[1] for r in res), sum(r[2] for r in res), 2
    else:
        o = LoaderOptions(batch_size=batch, arrow_threads=(mode == "1 loader + arrow threads"))
        cores = 1 if mode == "1 thread" else 2
        _drain(path, o)  # warm the page cache
        c0, t0 = cpu_seconds(), time.perf_counter()
        n = _drain(path, o)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    assert n == rows, (n, rows)
    rate = n / wall
    return {"name": f"loader {mode} batch={batch}", "samples": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "samples_per_s": round(rate), "cores": cores, "samples_per_s_per_core": round(rate / cores),
            "samples_per_cpu_s": round(n / cpu) if cpu > 0 else None,
            "target_per_core": LOADER_TARGET, "ratio_to_target": round(rate / cores / LOADER_TARGET, 2)}


def _environment() -> Dict[str, Any]:
    """The machine (CPU model, ISA flags and the ISA Neo's kernels and ATen chose: the record every
    benchmark carries, tools/bench_common.py), the date and the load."""
    machine = machine_info()
    print(describe_machine(machine))
    return {"machine": machine, "arch": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": os.getloadavg()}


def _take_numpy(parts, idx):
    """The loader's gather before ``neo._C.jagged_take`` (numpy, kept here as the baseline): rows
    grouped by block, taken per block (repeat + arange + fancy index per jagged column), then taken
    again into ``idx``'s order."""
    import numpy as np

    from data_pipeline.writer import Columns

    def take(cols, ix):
        sp = []
        for s in cols.sparse:
            vals, offs = s
            lens = offs[ix + 1] - offs[ix]
            new = np.zeros(len(ix) + 1, np.int64)
            np.cumsum(lens, out=new[1:])
            sp.append((vals[np.repeat(offs[ix] - new[:-1], lens) + np.arange(new[-1])], new))
        return Columns(cols.label[ix], cols.dense[ix], sp)

    bounds = np.cumsum([0] + [len(p) for p in parts])
    part = np.searchsorted(bounds, idx, side="right") - 1
    order = np.argsort(part, kind="stable")
    grouped = Columns.concat([take(parts[p], idx[order[part[order] == p]] - bounds[p]) for p in np.unique(part)])
    return take(grouped, np.argsort(order, kind="stable"))


def bench_multi_hot_take(batch: int, reps: int = 30, part_rows: int = 65536) -> List[Dict[str, Any]]:
    """A shuffled batch's gather from a window of 4 row groups (``part_rows`` rows each) of 10 multi-hot
    features (bags of 0-38 ids, 19 on average), as the loader does it: the numpy baseline and Neo's C++
    copy, side by side in one process, one thread; both must give the same batch. Timed interleaved:
    each of 3 warm-up and ``reps`` timed repetitions runs both gathers (a new shuffled batch per call),
    in the order of ``call_orders`` for the repetition index (neither right after itself)."""
    import numpy as np

    from data_pipeline.reader import take_from_parts
    from data_pipeline.writer import Columns

    rng = np.random.default_rng(0)
    parts = []
    for _ in range(4):
        n = part_rows
        sparse = []
        for _ in range(10):
            lens = rng.integers(0, 39, n)
            offs = np.zeros(n + 1, np.int64)
            np.cumsum(lens, out=offs[1:])
            sparse.append((rng.integers(0, 1 << 20, int(offs[-1])), offs))
        parts.append(Columns(rng.integers(0, 2, n).astype(np.int8), rng.random((n, 13), dtype=np.float32), sparse))
    idx = rng.permutation(4 * part_rows)[:batch]
    a, b = _take_numpy(parts, idx), take_from_parts(parts, idx)
    for (va, oa), (vb, ob) in zip(a.sparse, b.sparse):
        assert np.array_equal(va, vb) and np.array_equal(oa, ob), "the two gathers differ"
    out = []
    ids = sum(len(v) for v, _ in b.sparse)
    systems = (("multi-hot take: numpy (previous loader)", _take_numpy),
               ("multi-hot take: neo._C.jagged_take", take_from_parts))
    # a batch per call (rows not just read by the other gather), drawn before the timing
    batches = iter([rng.permutation(4 * part_rows)[:batch].copy() for _ in range(len(systems) * (reps + 3))])
    times = time_interleaved({name: (lambda fn=fn: fn(parts, next(batches))) for name, fn in systems}, 3, reps)
    for name, _ in systems:
        ts = sorted(times[name].wall)
        med = ts[len(ts) // 2]
        out.append({"name": name, "batch": batch, "ids": ids, "ms_per_batch": round(med * 1e3, 3),
                    "samples_per_s": round(batch / med)})
    out[1]["speedup_vs_numpy"] = round(out[0]["ms_per_batch"] / out[1]["ms_per_batch"], 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=positive_int, default=2_000_000, help="samples of the loader data set")
    ap.add_argument("--tsv-lines", type=positive_int, default=2_000_000, help="lines of the raw TSV")
    ap.add_argument("--batch-size", type=positive_int, default=4096)
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one, removed); a rerun "
                    "with the same one regenerates its raw.tsv, pre*/ and syn/")
    ap.add_argument("--sample", default=os.path.join(REPO, "data_pipeline", "samples", "criteo_kaggle_sample.tsv"))
    ap.add_argument("--json", default=None, type=json_path, help="write the records to this file")
    ap.add_argument("--take-only", action="store_true", help="only the multi-hot gather (numpy vs Neo's C++)")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from data_pipeline.synthetic import SynthOptions, generate
    records: List[Dict[str, Any]] = []
    for r in bench_multi_hot_take(2048):
        records.append(r)
        print(json.dumps(r), flush=True)
    if args.take_only:
        if args.json:
            write_json(args.json, {"environment": _environment(), "records": records})
        return 0
    work = args.workdir or tempfile.mkdtemp(prefix="neo_bench_")      # made here: removed in the finally below
    os.makedirs(work, exist_ok=True)
    try:
        tsv = os.path.join(work, "raw.tsv")
        lines = make_tsv(args.sample, tsv, args.tsv_lines)
        # One pass each, not interleaved: each preprocessing run is a single pass over the whole TSV
        # (plus its start-up run), and each loader mode below a single timed epoch after its warm-up
        # epoch; repeating them to interleave would multiply the run time (minutes at the defaults).
        for w, ex in ((1, "thread"), (2, "thread"), (2, "process")):
            records.append(bench_preprocess(tsv, args.sample, os.path.join(work, f"pre{w}"), w, lines, ex))
            print(json.dumps(records[-1]), flush=True)
        syn = os.path.join(work, "syn")
        shutil.rmtree(syn, ignore_errors=True)      # this script's own output of an earlier run (--workdir reused):
        t0 = time.perf_counter()                    # generated anew, since its time is one of the records
        o = SynthOptions(num_samples=args.rows, output=syn, num_dense=13, table_rows=[1_000_000] * 26,
                         ids_per_bag=[1], skew=[1.05], workers=2, auc_samples=100_000)
        generate(o)
        g = time.perf_counter() - t0
        records.append({"name": "synth (26 one-hot, 13 dense) 2 threads", "samples": args.rows, "wall_s": round(g, 3),
                        "samples_per_s": round(args.rows / g)})
        print(json.dumps(records[-1]), flush=True)
        for mode in ("1 thread", "1 loader + arrow threads", "2 ranks (2 processes)"):
            records.append(bench_loader(os.path.join(syn, "train"), args.batch_size, mode, args.rows))
            print(json.dumps(records[-1]), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    env = _environment()
    print(f"\nload average {os.getloadavg()}")
    print("%-45s %12s %12s %12s %8s" % ("benchmark", "rate/s", "per core", "per CPU-s", "x target"))
    for r in records:
        rate = r.get("lines_per_s", r.get("samples_per_s"))
        per = r.get("lines_per_s_per_core", r.get("samples_per_s_per_core", ""))
        cpu = r.get("lines_per_cpu_s", r.get("samples_per_cpu_s", ""))
        print("%-45s %12s %12s %12s %8s" % (r["name"], f"{rate:,}", f"{per:,}" if per != "" else "",
                                            f"{cpu:,}" if cpu else "", r.get("ratio_to_target", "")))
    if args.json:
        write_json(args.json, {"environment": env, "records": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
