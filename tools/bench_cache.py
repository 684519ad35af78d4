#!/usr/bin/env python3
"""Benchmark of the embedding cache (docs/cache.md): hit rates, training speed, a table larger than RAM.

    python tools/bench_cache.py --json bench_out/cache.json [--parts a,b,c,d] [--quick] [--plot PNG]

(a) **Hit rate vs capacity** of lru, lfu, lookahead (window 32) and Belady's optimum, and of a
    32-way set-associative cache (FBGEMM's GPU cache layout) with lru and lfu, on Zipf traces
    (alpha 0.9, 1.05, 1.2; 500k rows, 4096 ids per batch, 400 batches) and on traces drawn from the production
    access statistics (``data_pipeline/samples/dlrm_datasets_20xx_locality_stats.txt``: the
    mixture of 8 Zipf tables fitted to each file's reuse histogram at its batch of 65,536 lookups
    per table, rows and lookups scaled down 8-fold, one cache over all 8). Records: ``trace``, ``capacity``, ``capacity_fraction``, ``policy``,
    ``ways``, ``hit_rate``, ``conflict_misses``. Target: lookahead within 10% of Belady at 5%.
(b) **Training throughput** with a 5% cache against every row in memory, on the same data
    (``configs/cached_tables.yaml``: 4 tables x 2M rows, 2 ranks, torchrun): records with
    ``distribution``, ``policy``, ``cache_fraction``, ``samples_per_s``, ``in_memory_samples_per_s``.
    Medians of ``--rounds`` rounds, each running the in-memory model and the three policies back
    to back. Target: at least 0.8x on Zipf 1.05. (FBGEMM's and TorchRec's CPU paths have no cache, so the
    peer here is the same model with every row in memory.)
(d) **The index's admission time**: ``CacheIndex.admit`` (hits, misses, victims, slot maps) in C++
    (``neo._C.cache_admit``, ``kernel="auto"``) against its torch reference (``kernel="reference"``)
    on the same Zipf 1.05 trace (2M rows, a cache of 100k, 4096 ids per batch, the previous batch
    in flight, lookahead with a window of 32), the two alternating batch by batch: records with
    ``policy``, ``cpp_ms``, ``reference_ms`` (medians per admission) and ``speedup``; the two must
    admit every batch alike (checked).
(c) **A table twice this machine's RAM**, on disk (an mmap store in ``--disk-dir``) under a DRAM
    cache, trained for ``--disk-steps`` steps: samples/s, and the process's peak and final resident
    memory against ``--budget-gib``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))   # bench_common

POLICIES = ("lru", "lfu", "lookahead", "belady")
PARTS = ("a", "b", "c", "d")


def machine() -> Dict[str, Any]:
    """What every figure was measured on (``bench_common.machine_info``: CPU model, id, caches and
    ISA flags, the kernels' ISA, versions, date) and this machine's RAM."""
    from bench_common import machine_info

    return {**machine_info(), "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}


# ----------------------------------------------------------------------------- (a) hit rates
def zipf_trace(rows: int, batches: int, ids: int, alpha: float, seed: int) -> np.ndarray:
    from data_pipeline.locality import zipf_ranks

    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows)                                # hot rows spread over the table
    return perm[zipf_ranks(rng, batches * ids, rows, alpha)]


def production_trace(year: str, batches: int, scale: int, seed: int):
    """Batches of the 8 Zipf tables fitted to the file's reuse histogram at its own batch size
    (65,536 lookups per table; ``neo-data synth --preset production-<year>`` does the same),
    scaled down ``scale``-fold in rows and in lookups (the reuse per batch is unchanged), their
    row ranges stacked: one cache over a rank's 8 tables."""
    from data_pipeline.locality import fit_mixture, target_histogram, zipf_ranks
    from data_pipeline.samples import locality_stats_path

    target, sec = target_histogram(locality_stats_path(year))
    # one draw per candidate: the fit of the traces docs/benchmarks.md records (the preset's fit
    # averages four since 2026-12-06; this trace's tables stay the recorded ones)
    mix = fit_mixture(target, sec.batch_size, 8, seed=seed, draws=1)
    tables = [(max(1, r // scale), s) for r, s in mix.tables]
    ids = sec.batch_size // scale
    rng = np.random.default_rng(seed)
    offsets = np.cumsum([0] + [r for r, _ in tables])
    perms = [rng.permutation(r) for r, _ in tables]
    out = [np.concatenate([offsets[t] + perms[t][zipf_ranks(rng, ids, r, s)] for t, (r, s) in enumerate(tables)])
           for _ in range(batches)]
    return out, int(offsets[-1]), dict(mix.to_dict(), scaled_tables=tables, ids_per_table=ids, scale=scale)


def part_a(args) -> List[Dict[str, Any]]:
    from neo.embedding.cache.simulate import batch_rows, report

    fractions = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    traces = []
    nb = 100 if args.quick else 400
    for alpha in (0.9, 1.05, 1.2):
        rows, B = 500_000, 4096
        t = zipf_trace(rows, nb, B, alpha, seed=1)
        traces.append((f"zipf-{alpha}", batch_rows(t, B, rows), rows, {"alpha": alpha, "ids_per_batch": B}))
    for year in ("2021", "2022"):
        parts, rows, mix = production_trace(year, 40 if args.quick else 150, 8, seed=1)
        traces.append((f"production-{year}", [np.unique(p) for p in parts], rows,
                       {"ids_per_batch": sum(len(p) for p in parts) // len(parts), "mixture": mix}))
    out = []
    args.trace_info = {name: info for name, _, _, info in traces}
    for name, batches, rows, info in traces:
        distinct = float(np.mean([len(b) for b in batches]))
        caps = [int(f * rows) for f in fractions if f * rows >= 2 * distinct]
        t0 = time.perf_counter()
        res = report(batches, rows, caps, POLICIES, lookahead=32, pipelined=True)
        res += report(batches, rows, caps, ("lru", "lfu"), ways=32)
        for r in res:
            d = r.to_dict()
            d.update(trace=name, rows=rows, capacity_fraction=round(r.capacity / rows, 4),
                     distinct_per_batch=round(distinct, 1), ways=d.get("ways", None))
            out.append(d)
        best = {r.capacity: r.hit_rate for r in res if r.policy == "belady"}
        five = int(0.05 * rows)                                 # the 5% capacity, as caps computes it
        line = " ".join(f"{r.policy}{'/32w' if r.ways else ''}@{r.capacity / rows:.0%}={r.hit_rate:.3f}"
                        for r in res if r.capacity == five)
        la = [r for r in res if r.policy == "lookahead" and r.capacity == five and not r.ways]
        verdict = (f"lookahead/belady {la[0].hit_rate / best[la[0].capacity]:.3f}" if la else
                   f"no 5% cache: 5% of {rows} rows is under two batches' {distinct:.0f} distinct rows")
        print(f"(a) {name:16s} {line}  {verdict}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def plot_a(records, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    traces = list(dict.fromkeys(r["trace"] for r in records))
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.6), sharey=True)
    for ax, name in zip(np.atleast_1d(axes), traces):
        for pol, ways, style in (("belady", None, "k-"), ("lookahead", None, "C0-"), ("lfu", None, "C1-"),
                                 ("lru", None, "C2-"), ("lfu", 32, "C1:"), ("lru", 32, "C2:")):
            rs = sorted((r for r in records if r["trace"] == name and r["policy"] == pol and r.get("ways") == ways),
                        key=lambda r: r["capacity_fraction"])
            if rs:
                ax.plot([100 * r["capacity_fraction"] for r in rs], [r["hit_rate"] for r in rs], style,
                        marker="o", ms=3, label=pol + (f" {ways}-way" if ways else ""))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(name)
        ax.set_xlabel("cache size, % of rows")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("hit rate (distinct ids per batch)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


# ----------------------------------------------------------------------------- (b) training
def _train(overrides: List[str], steps: int) -> Dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="neo-torchrun-") as logs:      # else a torchelastic_* folder per run
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--log-dir", logs, "-m", "neo.train", "configs/cached_tables.yaml", "train.progress=false",
               f"train.steps={steps}"] + overrides
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"training failed ({' '.join(overrides)}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


DEVICE = [f"tables.{k}.{x}" for k in range(4) for x in ("placement=device", "cache_load_factor=null")]


def part_b(args) -> List[Dict[str, Any]]:
    """Each round runs the in-memory model and the three policies back to back; figures are the
    medians over ``--rounds`` rounds (this machine is shared: a round's runs see the same load)."""
    out = []
    steps = 150 if args.quick else 400
    for alpha in ([1.05] if args.quick else [1.05, 0.9, 1.2]):
        data = [f"data.synthetic.skew=[{alpha}]"]
        base: List[float] = []
        runs: Dict[str, List[Dict[str, Any]]] = {p: [] for p in ("lookahead", "lfu", "lru")}
        for _ in range(args.rounds):
            base.append(_train(data + DEVICE, steps)["samples_per_s"])
            for pol in runs:
                runs[pol].append(_train(data + [f"tables.{k}.cache_policy={pol}" for k in range(4)], steps))
        in_mem = float(np.median(base))
        for pol, fs in runs.items():
            sps = [f["samples_per_s"] for f in fs]
            f = fs[int(np.argsort(sps)[len(sps) // 2])]                   # the median run's details
            st = f["cache"]
            hit = float(np.mean([s["hit_rate"] for s in st.values()]))
            rec = {"distribution": f"zipf-{alpha}", "policy": pol, "cache_fraction": 0.05,
                   "samples_per_s": float(np.median(sps)), "in_memory_samples_per_s": round(in_mem, 1),
                   "runs_samples_per_s": sps, "in_memory_runs": base,
                   "ratio": round(float(np.median(sps)) / in_mem, 3),
                   "round_ratios": [round(a / b, 3) for a, b in zip(sps, base)], "hit_rate": round(hit, 4),
                   "prefetch_ms_per_step": round(1e3 * sum(s["prefetch_s"] for s in st.values()) / steps / 2, 3),
                   "exposed_ms_per_step": round(1e3 * sum(s["exposed_s"] for s in st.values()) / steps / 2, 3),
                   "phase_ms_per_step": f["phase_ms_per_step"], "steps": steps, "world_size": 2,
                   "rounds": args.rounds, "load_average": os.getloadavg()}
            out.append(rec)
            print(f"(b) zipf-{alpha} {pol:9s} {rec['samples_per_s']:10.0f} samples/s vs {in_mem:10.0f} in memory: "
                  f"{rec['ratio']:.3f}x (rounds {rec['round_ratios']}, hit rate {hit:.3f}, prefetch "
                  f"{rec['prefetch_ms_per_step']} ms/step, exposed {rec['exposed_ms_per_step']})", flush=True)
    return out


# ----------------------------------------------------------------------------- (d) index
def part_d(args) -> List[Dict[str, Any]]:
    import torch

    from neo.embedding.cache import CacheIndex
    from neo.host_memory import retain_freed_memory

    retain_freed_memory()                                     # as training runs
    rows, cap, ids, window = 2_000_000, 100_000, 4096, 32
    batches = 160 if args.quick else 400
    trace = zipf_trace(rows, batches + window, ids, 1.05, seed=5).reshape(-1, ids)
    sets = [torch.unique(torch.from_numpy(b)) for b in trace]
    out = []
    for pol in ("lookahead", "lfu", "lru"):
        idx = {k: CacheIndex("bench", rows, cap, pol, kernel=k) for k in ("auto", "reference")}
        times: Dict[str, List[float]] = {k: [] for k in idx}
        for i in range(batches):
            future = sets[i + 1:i + 1 + window] if pol == "lookahead" else []
            adm = {}
            for k in (("auto", "reference") if i % 2 else ("reference", "auto")):
                t0 = time.perf_counter()
                adm[k] = idx[k].admit(sets[i], future)
                times[k].append(time.perf_counter() - t0)
                if i:
                    idx[k].complete(i)                        # the previous batch's step is done
            a, r = adm["auto"], adm["reference"]
            if not (torch.equal(a.slots, r.slots) and torch.equal(a.evicted_rows, r.evicted_rows)):
                raise RuntimeError(f"(d) {pol}: batch {i} admitted differently by the C++ index and the reference")
        warm = 80                                             # the cache fills in about 50: evictions from then on
        cpp, ref = (1e3 * float(np.median(times[k][warm:])) for k in ("auto", "reference"))
        rec = {"policy": pol, "rows": rows, "capacity": cap, "ids_per_batch": ids, "batches": batches,
               "window": window if pol == "lookahead" else 0, "cpp_ms": round(cpp, 3), "reference_ms": round(ref, 3),
               "speedup": round(ref / cpp, 2)}
        out.append(rec)
        print(f"(d) {pol:9s} admission: C++ {cpp:.3f} ms, torch reference {ref:.3f} ms: {ref / cpp:.1f}x", flush=True)
    return out


# ----------------------------------------------------------------------------- (c) disk
def part_c(args) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--disk-run", "--disk-dir", args.disk_dir,
           "--budget-gib", str(args.budget_gib), "--disk-steps", str(args.disk_steps),
           "--disk-gib", str(args.disk_gib), "--store-resident-gib", str(args.store_resident_gib)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200,
                       env=dict(os.environ, OMP_NUM_THREADS="2"))
    sys.stderr.write(p.stderr[-2000:])
    if p.returncode != 0:
        raise RuntimeError(f"disk run failed:\n{p.stderr[-3000:]}")
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"(c) {rec['table_gib']:.1f} GiB table on disk ({rec['table_over_ram']:.2f}x RAM): {rec['samples_per_s']:.0f} "
          f"samples/s over {rec['steps']} steps; peak RSS {rec['peak_rss_gib']:.2f} GiB (budget {rec['budget_gib']} GiB), "
          f"hit rate {rec['hit_rate']:.3f}", flush=True)
    return rec


def _rss() -> Dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssFile", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
    return out


DISK_DIM = 64
DISK_ROW_BYTES = DISK_DIM * 4 + 4                              # fp32 weights + rowwise_adagrad state
DISK_BATCH = 8192                                              # ids per batch (one per sample)
DISK_CACHE_FRACTION = 0.01


def min_disk_gib() -> float:
    """The smallest --disk-gib whose cache (DISK_CACHE_FRACTION of the rows) holds two batches'
    distinct rows, at most 2 x DISK_BATCH: the step computing and the batch prefetched under it
    (a smaller one fails with CacheCapacityError)."""
    min_rows = -(-2 * DISK_BATCH * 100 // round(DISK_CACHE_FRACTION * 100))
    return min_rows * DISK_ROW_BYTES / 2**30


def disk_gib_arg(s: str) -> float:
    """--disk-gib: 0 (the default: 2 x RAM) or at least min_disk_gib()."""
    from bench_common import nonneg_float

    v = nonneg_float(s)
    if 0 < v < min_disk_gib():
        raise argparse.ArgumentTypeError(
            f"{s} GiB is too small: the disk run's cache is {DISK_CACHE_FRACTION:.0%} of the rows and must hold two "
            f"batches of {DISK_BATCH} ids, so the table needs at least {min_disk_gib():.3f} GiB (or 0: 2 x RAM)")
    return v


def parts_arg(s: str) -> List[str]:
    """--parts: a comma-separated list of a, b, c, d."""
    out = [x.strip() for x in s.split(",")]
    bad = [x for x in out if x not in PARTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(map(repr, bad))}: choose from "
                                         f"{', '.join(PARTS)} (comma-separated, e.g. a,b)")
    return out


def disk_run(args) -> None:
    """Runs in its own process: one cached table of ``--disk-gib`` (default 2 x RAM) on disk."""
    import torch

    from data_pipeline.locality import coprime_multiplier, zipf_ranks
    from neo.config.embedding import OptimizerConfig, TableConfig
    from neo.embedding import TableBatchedEmbedding
    from neo.sparse import KeyedJaggedBatch

    torch.manual_seed(0)
    ram = machine()["ram_bytes"]
    D = DISK_DIM
    row_bytes = DISK_ROW_BYTES
    gib = args.disk_gib or 2 * ram / 2**30
    rows = int(gib * 2**30 / row_bytes)
    B, steps = DISK_BATCH, args.disk_steps
    cache_rows = int(DISK_CACHE_FRACTION * rows)
    t = TableConfig("huge", rows, D, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.05), placement="cached",
                    cache_rows=cache_rows, cache_policy="lru", cache_store="mmap", init_scale=0.01,
                    cache_store_resident_gib=args.store_resident_gib)
    t0 = time.perf_counter()
    emb = TableBatchedEmbedding([t], backend="cpu", store_dir=args.disk_dir, validate=False)
    init_s = time.perf_counter() - t0
    head = torch.nn.Linear(D, 1)
    opt = torch.optim.Adagrad(head.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    mult = coprime_multiplier(rows, 2654435761)                 # a bijection mod rows

    def batch():
        ids = (zipf_ranks(rng, B, rows, 1.05).astype(np.int64) * mult) % rows
        return (KeyedJaggedBatch(("huge",), torch.from_numpy(ids), torch.ones(B, dtype=torch.int64), B),
                torch.randint(0, 2, (B,)).float())

    nxt = batch()
    peak = _rss()
    t0 = time.perf_counter()
    for step in range(steps):
        cur, nxt = nxt, batch()
        emb.prefetch(nxt[0])                                    # batch i+1's rows under step i
        logits = head(emb(cur[0])).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, cur[1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            r = _rss()
            peak = {k: max(peak.get(k, 0), v) for k, v in r.items()}
    dt = time.perf_counter() - t0
    emb.flush_cache()
    r = _rss()
    peak = {k: max(peak.get(k, 0), v) for k, v in r.items()}
    s = emb.cache_stats()["huge"].as_dict()
    rec = {"table_rows": rows, "dim": D, "table_gib": rows * row_bytes / 2**30, "ram_gib": ram / 2**30,
           "table_over_ram": rows * row_bytes / ram, "cache_rows": cache_rows, "cache_fraction": cache_rows / rows,
           "policy": "lru", "store": "mmap", "batch_ids": B, "steps": steps, "samples_per_s": steps * B / dt,
           "init_s": round(init_s, 1), "train_s": round(dt, 1), "hit_rate": s["hit_rate"],
           "peak_rss_gib": peak["VmHWM"] / 2**30, "final_rss_gib": r["VmRSS"] / 2**30,
           "peak_rss_file_gib": peak.get("RssFile", 0) / 2**30, "budget_gib": args.budget_gib,
           "under_budget": peak["VmHWM"] <= args.budget_gib * 2**30, "cache_stats": s,
           "disk_dir": args.disk_dir, **machine()}
    print(json.dumps(rec))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from bench_common import json_path, positive_float, positive_int

    ap.add_argument("--json", default=None, type=json_path, help="write the records here")
    ap.add_argument("--parts", default=list(PARTS), type=parts_arg, help="comma-separated parts to run, of a, b, c, d")
    ap.add_argument("--quick", action="store_true", help="shorter traces and runs (a smoke test)")
    ap.add_argument("--rounds", type=positive_int, default=3, help="(b): rounds of in-memory + cached runs (medians)")
    ap.add_argument("--plot", default=None, type=json_path, help="PNG of hit rate vs capacity (needs matplotlib)")
    ap.add_argument("--disk-dir", default=os.path.join(ROOT, ".cache", "bench_cache_store"))
    ap.add_argument("--disk-gib", type=disk_gib_arg, default=0.0,
                    help=f"size of the on-disk table (default 0: 2 x RAM; at least {min_disk_gib():.3f})")
    ap.add_argument("--disk-steps", type=positive_int, default=200)
    ap.add_argument("--budget-gib", type=positive_float, default=6.0,
                    help="resident memory the disk run must stay under")
    ap.add_argument("--store-resident-gib", type=positive_float, default=1.0,
                    help="the disk run's cache_store_resident_gib")
    ap.add_argument("--disk-run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.disk_run:
        disk_run(args)
        return 0
    parts = set(args.parts)
    out: Dict[str, Any] = {"benchmark": "cache", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "machine": machine(), "command": " ".join([sys.executable, *sys.argv])}
    if "a" in parts:
        out["hit_rates"] = part_a(args)
        out["traces"] = args.trace_info
        if args.plot:
            plot_a(out["hit_rates"], args.plot)
    if "b" in parts:
        out["training"] = part_b(args)
    if "c" in parts:
        out["disk"] = part_c(args)
    if "d" in parts:
        out["index"] = part_d(args)
    if args.json:
        from bench_common import write_json

        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
